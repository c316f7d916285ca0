"""The stand-in device itself: its tensors, how every operation on them runs on the backing
device, and its registration with PyTorch (see dplab.sim)."""

import threading

import torch
from torch.utils._pytree import tree_map

TYPE = "sim"
_state = {"enabled": False, "registered": False, "count": 2, "backing": torch.device("cpu")}
_lock = threading.Lock()
_cuda_synchronize = torch.cuda.synchronize


def is_stand_in(device) -> bool:
    """Return True for a stand-in device (a torch.device or a string such as "sim:1")."""
    try:
        return torch.device(device).type == TYPE
    except (TypeError, RuntimeError):
        return False


def _index(device) -> int:
    return torch.device(device).index or 0


def _same_device_error(a: str, b: str) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}!"
    )


class StandInTensor(torch.Tensor):
    """A tensor on a stand-in device: the data lives in `self.backing` on the backing device."""

    backing: torch.Tensor
    index: int

    @staticmethod
    def __new__(cls, backing: torch.Tensor, index: int, requires_grad: bool = False):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            backing.shape,
            strides=backing.stride(),
            storage_offset=backing.storage_offset(),
            dtype=backing.dtype,
            layout=backing.layout,
            device=torch.device("cpu"),  # see the module docstring
            requires_grad=requires_grad,
        )
        wrapper.backing = backing
        wrapper.index = index
        return wrapper

    @property
    def device(self) -> torch.device:
        return torch.device(TYPE, self.index)

    def __getattr__(self, name: str):
        # Only for a name that does not exist (a typo such as `require_grad_`): the message a
        # GPU's tensor gives, so that the error and the hint keyed to it are the same here.
        raise AttributeError(f"'Tensor' object has no attribute '{name}'", name=name, obj=self)

    def __repr__(self, *, tensor_contents=None) -> str:
        with torch._C.DisableTorchFunctionSubclass():
            text = repr(self.backing.detach())
        device = f"device='{TYPE}:{self.index}'"
        text = text.replace("device='cuda:0'", device)
        if device not in text:
            text = text[:-1] + f", {device})"
        if self.requires_grad and "requires_grad" not in text and "grad_fn" not in text:
            fn = self.grad_fn
            extra = f"grad_fn=<{type(fn).__name__}>" if fn is not None else "requires_grad=True"
            text = text[:-1] + f", {extra})"
        return text

    def get_device(self) -> int:
        return self.index

    # Declaring the inner tensor makes nn.Module.to() swap parameters in place (keeping the
    # very Parameter objects) instead of assigning `.data` across kinds of tensor.
    def __tensor_flatten__(self):
        return ["backing"], {"index": self.index}

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return StandInTensor(inner["backing"], meta["index"])

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return repr(self) if not spec else object.__format__(self, spec)

    def __reduce_ex__(self, protocol):
        # Saved as an ordinary CPU tensor, as there is no stand-in to load it onto later.
        return self.backing.detach().to("cpu").__reduce_ex__(protocol)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _MOVES:
            moved = _move(func, args, kwargs)
            if moved is not NotImplemented:
                return moved
        elif func in _HOST_ONLY:
            return _HOST_ONLY[func](*args, **kwargs)
        elif (
            getattr(func, "__self__", None) is _DATA
            and func.__name__ == "__set__"
            and isinstance(args[0], StandInTensor)
        ):
            return _set_data(*args)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


_DATA = torch._C.TensorBase.data  # its setter, `t.data = other`, is caught above


def _set_data(self: StandInTensor, other: torch.Tensor) -> None:
    """`t.data = other`: from now on `t` shares `other`'s memory and device, as on a GPU."""
    if not isinstance(other, StandInTensor):
        raise RuntimeError(
            f"t.data = ... with a tensor on {other.device}: a tensor on a stand-in device can "
            "take the data of another stand-in tensor only; copy it instead (t.copy_(...))"
        )
    if other.shape != self.shape or other.dtype != self.dtype or other.stride() != self.stride():
        raise RuntimeError(
            "t.data = ... with a tensor of another shape, dtype or layout, which a stand-in "
            "tensor cannot take: copy the values instead (t.copy_(...))"
        )
    self.backing, self.index = other.backing, other.index


def _numpy(self, *args, **kwargs):
    raise TypeError(
        f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy "
        "the tensor to host memory first."
    )


def _tolist(self):
    return self.backing.tolist()


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False, **kwargs):
    return torch.tensor(  # the stand-ins' own, once they are on (see dplab.sim.switch)
        data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad
    )


def backing(t: torch.Tensor) -> torch.Tensor:
    """Return the tensor holding a stand-in tensor's data (a plain tensor is its own)."""
    return t.backing if isinstance(t, StandInTensor) else t


def _target(args, kwargs):
    """Return the device named by a call of Tensor.to, or None."""
    for value in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(value, torch.device | str):
            try:
                return torch.device(value)
            except RuntimeError:
                continue
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _move(func, args, kwargs):
    """Make Tensor.to to or from a stand-in a real, differentiable copy."""
    self = args[0]
    if not isinstance(self, StandInTensor):
        return NotImplemented
    if func is torch.Tensor.cpu:
        return _Leave.apply(self, torch.device("cpu"))
    if func is torch.Tensor.cuda:
        return _Leave.apply(self, torch.device("cuda", args[1] if len(args) > 1 else 0))
    if func is torch.Tensor.to:
        target = _target(args, kwargs)
        if target is None:
            return NotImplemented
        if not is_stand_in(target):
            left = _Leave.apply(self, target)
            rest = [a for a in args[1:] if isinstance(a, torch.dtype)]
            return left.to(*rest, **{k: v for k, v in kwargs.items() if k != "device"})
        if _index(target) == self.index and not kwargs.get("copy", False):
            return self
        moved = _Move.apply(self, _index(target))
        dtype = next(
            (a for a in list(args[1:]) + [kwargs.get("dtype")] if isinstance(a, torch.dtype)), None
        )
        return moved if dtype is None or dtype == moved.dtype else moved.to(dtype)
    return NotImplemented


class _Enter(torch.autograd.Function):
    """A copy from a real device onto a stand-in; its gradient goes back to that device."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.device = x.device
        with torch._C.DisableTorchFunction():  # the backing device, named as it is
            return StandInTensor(x.detach().to(_state["backing"], copy=True), index)

    @staticmethod
    def backward(ctx, grad):
        with torch._C.DisableTorchFunction():  # the device it came from, named as it is
            return backing(grad).to(ctx.device, copy=True), None


_original_to = torch.Tensor.to


def _to(self, *args, **kwargs):
    """Tensor.to, with moves onto a stand-in made differentiable copies."""
    if not isinstance(self, StandInTensor):
        target = _target((self, *args), kwargs)
        if target is not None and is_stand_in(target):
            moved = _Enter.apply(self, _index(target))
            dtype = next(
                (a for a in [*args, kwargs.get("dtype")] if isinstance(a, torch.dtype)), None
            )
            return moved if dtype is None or dtype == moved.dtype else moved.to(dtype)
    return _original_to(self, *args, **kwargs)


class _Leave(torch.autograd.Function):
    """A copy from a stand-in to a real device; its gradient comes back to the stand-in."""

    @staticmethod
    def forward(ctx, x, device):
        ctx.source = x.index
        with torch._C.DisableTorchFunctionSubclass():
            return x.backing.to(device, copy=True)

    @staticmethod
    def backward(ctx, grad):
        with torch._C.DisableTorchFunctionSubclass():
            with torch._C.DisableTorchFunction():
                return StandInTensor(grad.to(_state["backing"], copy=True), ctx.source), None


class _Move(torch.autograd.Function):
    """A copy from one stand-in to another; its gradient goes back to the first one."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.source = x.index
        with torch._C.DisableTorchFunctionSubclass():
            return StandInTensor(x.backing.clone(), index)

    @staticmethod
    def backward(ctx, grad):
        with torch._C.DisableTorchFunctionSubclass():
            return StandInTensor(backing(grad).clone(), ctx.source), None


def _map(fn, x):
    """Apply `fn` to every leaf of nested tuples, lists and dicts (torch's tree_map, without
    its bookkeeping: this runs for every operation on a stand-in, and plain containers are
    all that operations take and give)."""
    kind = type(x)
    if kind is tuple:
        return tuple([_map(fn, v) for v in x])
    if kind is list:
        return [_map(fn, v) for v in x]
    if kind is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    if isinstance(x, tuple | list | dict):  # named tuples and other kinds: the general map
        return tree_map(fn, x)
    return fn(x)


def _run(func, args, kwargs):
    """Run one operation on the backing tensors and wrap its results on the right stand-in."""
    indices: set[int] = set()
    others: list[str] = []
    wrappers: dict[int, StandInTensor] = {}

    def unwrap(x):
        if isinstance(x, StandInTensor):
            indices.add(x.index)
            wrappers[id(x.backing)] = x
            return x.backing
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            others.append(str(x.device))
        return x

    plain_args = _map(unwrap, args)
    plain_kwargs = _map(unwrap, kwargs)
    target = plain_kwargs.get("device")
    if func in _MIXED_OK:  # copy_ moves data across devices, as on GPUs: the result is `self`
        out = func(*plain_args, **plain_kwargs)
        return args[0] if isinstance(args[0], StandInTensor) else out
    if len(indices) > 1:
        a, b = sorted(indices)[:2]
        raise _same_device_error(f"{TYPE}:{a}", f"{TYPE}:{b}")
    index = next(iter(indices), 0)
    if func is _TO_COPY and indices and _is_cpu(target):
        # To PyTorch's C++ core a stand-in tensor is a CPU tensor, so a cast made there
        # (autocast's, or the gradient of `.half()` going back to float32) names the CPU:
        # the copy stays on the stand-in. Python's moves to the CPU never come here (_move).
        target = None
        plain_kwargs["device"] = _state["backing"]
    moving_out = func is _TO_COPY and target is not None
    if others and not moving_out and func not in _CPU_INDICES_OK:
        raise _same_device_error(f"{TYPE}:{index}", others[0])
    if target is not None:
        if is_stand_in(target):
            index = _index(target)
            plain_kwargs["device"] = _state["backing"]
        elif moving_out:  # leaving the stand-ins: the result is a plain tensor
            return func(*plain_args, **plain_kwargs)
    if _state["backing"].type == "cuda" and torch.is_autocast_enabled("cuda"):
        # Autocast saw the stand-in tensors as the CPU's (dplab.sim.gpus): once is enough.
        with torch.autocast("cuda", enabled=False):
            out = func(*plain_args, **plain_kwargs)
    else:
        out = func(*plain_args, **plain_kwargs)

    def wrap(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, StandInTensor):
            same = wrappers.get(id(x))
            return same if same is not None else StandInTensor(x, index)
        return x

    return _map(wrap, out)


_TO_COPY = torch.ops.aten._to_copy.default


def _is_cpu(device) -> bool:
    return device is not None and torch.device(device).type == "cpu"


# Indexing takes CPU index tensors on a GPU tensor; so it does on a stand-in.
_CPU_INDICES_OK = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put_.default,
    torch.ops.aten.index_put.default,
    torch.ops.aten._index_put_impl_.default,
}

# Operations where a plain tensor may meet a stand-in tensor: copying between them.
_MIXED_OK = {
    torch.ops.aten.copy_.default,
    torch.ops.aten._copy_from.default,
    torch.ops.aten._copy_from_and_resize.default,
}


# ---- factory kernels for the PrivateUse1 backend ------------------------------------------

_library = None


def _register_kernels() -> None:
    global _library
    _library = torch.library.Library("aten", "IMPL")

    def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        with torch._C.DisableTorchFunction():  # the backing device, named as it is
            data = torch.empty(
                size,
                dtype=dtype,
                device=_state["backing"],
                memory_format=memory_format or torch.contiguous_format,
            )
        return StandInTensor(data, _index(device) if device is not None else 0)

    def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
        with torch._C.DisableTorchFunction():
            data = torch.empty_strided(size, stride, dtype=dtype, device=_state["backing"])
        return StandInTensor(data, _index(device) if device is not None else 0)

    def copy_from(source, destination, non_blocking=False):
        # Reached without the Python key, as torch.tensor(..., device="sim:k") does.
        with torch._C.DisableTorchFunctionSubclass():
            backing(destination).copy_(backing(source))
        return destination

    def copy_from_and_resize(source, destination):
        backing(destination).resize_(backing(source).shape)
        return copy_from(source, destination)

    _library.impl("empty.memory_format", empty, "PrivateUse1")
    _library.impl("empty_strided", empty_strided, "PrivateUse1")
    _library.impl("_copy_from", copy_from, "PrivateUse1")
    _library.impl("_copy_from_and_resize", copy_from_and_resize, "PrivateUse1")


class _Backend:
    """What PyTorch asks of a device module (torch.sim)."""

    @staticmethod
    def is_available() -> bool:
        """False: to PyTorch, stand-ins are no accelerator. What asks (torch.accelerator,
        and through it the DataLoader's `pin_memory=True`) then does what it does on a
        machine without GPUs: a loader warns that it cannot pin memory and loads as usual,
        instead of asking this backend for pinned memory, which it cannot give."""
        return False

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return _state["count"]

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        pass

    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        """The random state of the device the stand-ins compute on (torch.random.fork_rng
        saves and restores it)."""
        backing = _state["backing"]
        if backing.type == "cuda":
            return torch.cuda.get_rng_state(backing)
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device=None) -> None:
        backing = _state["backing"]
        if backing.type == "cuda":
            torch.cuda.set_rng_state(state, backing)
        else:
            torch.set_rng_state(state)

    @staticmethod
    def synchronize(device=None) -> None:
        synchronize()


# Calls that __torch_function__ handles itself (looked up at call time, so defined here).
_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, _to}
_HOST_ONLY = {
    torch.Tensor.numpy: _numpy,
    torch.Tensor.tolist: _tolist,
    torch.Tensor.new_tensor: _new_tensor,
}


def register(backing_device: torch.device | None = None) -> None:
    """Make the `sim` device type exist (its name and kernels), without changing torch's
    own functions; `enable` does that. Once per process: PyTorch cannot unregister it."""
    with _lock:
        if _state.get("registered"):
            return
        if backing_device is None:
            backing_device = (
                torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
            )
        _state["backing"] = torch.device(backing_device)
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(TYPE, backend_module=_Backend())
        _register_kernels()
        _state["registered"] = True


def enabled() -> bool:
    """Return True once stand-in devices are on in this process."""
    return _state["enabled"]


def count() -> int:
    """Return how many stand-in devices there are."""
    return _state["count"]


def backing_device() -> torch.device:
    """Return the device stand-in tensors compute on."""
    return _state["backing"]


def synchronize() -> None:
    """Wait for the work queued on the stand-ins: on the GPU behind them, if there is one."""
    if _state["backing"].type == "cuda":
        _cuda_synchronize(_state["backing"])  # CUDA's own, whatever torch.cuda answers now
