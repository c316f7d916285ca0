"""Stand-in devices: `sim:0`, `sim:1`, ... that behave like separate GPUs on one machine.

Each stand-in tensor is a thin wrapper around an ordinary tensor on the backing device (the
CPU, or the one GPU if there is one), plus the number of the stand-in it lives on. Every
operation unwraps its inputs, checks that they all live on one stand-in (else it raises the
error real GPUs raise), runs on the backing device, and wraps the results on that stand-in.
So the arithmetic is exactly the backing device's, and a forgotten `.to(device)` fails as it
would on two GPUs.

How it plugs into PyTorch:
- the device type `sim` is PyTorch's PrivateUse1 backend, set up from Python;
- factory functions given `device="sim:k"` reach two small kernels registered for that
  backend (`empty` and `empty_strided`), which make the wrapper; `torch.tensor`,
  `torch.as_tensor` and `torch.asarray`, which copy below the Python layer, are wrapped;
- at the C++ level every wrapper sits on `sim:0` (PyTorch's device guard knows one device);
  the Python `device` property reports the real stand-in, and `Tensor.to` between two
  stand-ins is caught in `__torch_function__` and made a real, differentiable copy;
- `nn.parallel.scatter` and `nn.DataParallel` use CUDA-only collectives, so for stand-ins
  they get plain Python equivalents (split and copy, replicate, apply in turn, gather).

What it cannot do: to PyTorch's C++ core a stand-in tensor is a CPU tensor, so the few
composite operations that build tensors from `self.options()` before any Python code runs
(`F.one_hot` is one) make CPU tensors and then fail with a mixed-device error; and
`untyped_storage()` has nothing to show.
"""

import functools
import threading

import torch
from torch import nn
from torch.utils._pytree import tree_map

TYPE = "sim"
_state = {"enabled": False, "registered": False, "count": 2, "backing": torch.device("cpu")}
_lock = threading.Lock()


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
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _numpy(self, *args, **kwargs):
    raise TypeError(
        f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy "
        "the tensor to host memory first."
    )


def _tolist(self):
    return self.backing.tolist()


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False, **kwargs):
    return tensor(
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
        return StandInTensor(x.detach().to(_state["backing"], copy=True), index)

    @staticmethod
    def backward(ctx, grad):
        with torch._C.DisableTorchFunctionSubclass():
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
    moving_out = func is torch.ops.aten._to_copy.default and target is not None
    if others and not moving_out and func not in _CPU_INDICES_OK:
        raise _same_device_error(f"{TYPE}:{index}", others[0])
    if target is not None:
        if is_stand_in(target):
            index = _index(target)
            plain_kwargs["device"] = _state["backing"]
        elif moving_out:  # leaving the stand-ins: the result is a plain tensor
            return func(*plain_args, **plain_kwargs)
    out = func(*plain_args, **plain_kwargs)

    def wrap(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, StandInTensor):
            same = wrappers.get(id(x))
            return same if same is not None else StandInTensor(x, index)
        return x

    return _map(wrap, out)


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
        data = torch.empty(
            size,
            dtype=dtype,
            device=_state["backing"],
            memory_format=memory_format or torch.contiguous_format,
        )
        return StandInTensor(data, _index(device) if device is not None else 0)

    def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
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


# ---- nn.parallel for stand-ins ------------------------------------------------------------


def scatter_tensor(tensor: torch.Tensor, devices, dim: int = 0) -> tuple[torch.Tensor, ...]:
    """Split along `dim` with torch.chunk's sizes and copy each chunk to its device."""
    chunks = torch.chunk(tensor, len(devices), dim=dim)
    return tuple(c.to(d) for c, d in zip(chunks, devices, strict=False))


def _scatter_obj(obj, devices, dim):
    if isinstance(obj, torch.Tensor):
        return scatter_tensor(obj, devices, dim)
    if isinstance(obj, tuple | list) and obj:
        parts = [_scatter_obj(o, devices, dim) for o in obj]
        return [
            type(obj)(p) if isinstance(obj, list) else tuple(p) for p in zip(*parts, strict=True)
        ]
    if isinstance(obj, dict) and obj:
        parts = [_scatter_obj(v, devices, dim) for v in obj.values()]
        return [dict(zip(obj.keys(), p, strict=True)) for p in zip(*parts, strict=True)]
    return [obj for _ in devices]


def replicate(network: nn.Module, devices) -> list[nn.Module]:
    """Return one copy of `network` per device, whose parameters are differentiable copies."""
    modules = list(network.modules())
    replicas = []
    for device in devices:
        memo = {m: m._replicate_for_data_parallel() for m in modules}
        for m in modules:
            r = memo[m]
            for name, child in m._modules.items():
                r._modules[name] = memo[child] if child is not None else None
            for name, p in m._parameters.items():
                r._parameters[name] = None if p is None else p.to(device)
            for name, b in m._buffers.items():
                r._buffers[name] = None if b is None else b.to(device)
        replicas.append(memo[network])
    return replicas


def gather(outputs, target, dim: int = 0):
    """Bring the replicas' outputs to `target` and concatenate them along `dim`."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([o.to(target) for o in outputs], dim=dim)
    if isinstance(first, tuple | list):
        return type(first)(gather(list(parts), target, dim) for parts in zip(*outputs, strict=True))
    if isinstance(first, dict):
        return {k: gather([o[k] for o in outputs], target, dim) for k in first}
    return first


_original_tensor, _original_as_tensor, _original_asarray = (
    torch.tensor,
    torch.as_tensor,
    torch.asarray,
)


@functools.wraps(_original_tensor)
def tensor(data, *args, device=None, requires_grad=False, **kwargs):
    """torch.tensor, which also builds tensors on stand-ins (copied from the CPU)."""
    if device is not None and is_stand_in(device):
        made = _original_tensor(data, *args, **kwargs).to(device)
        return made.requires_grad_(requires_grad) if requires_grad else made
    return _original_tensor(data, *args, device=device, requires_grad=requires_grad, **kwargs)


@functools.wraps(_original_as_tensor)
def as_tensor(data, dtype=None, device=None):
    """torch.as_tensor, which also builds tensors on stand-ins."""
    if device is not None and is_stand_in(device):
        return _original_as_tensor(data, dtype=dtype).to(device)
    return _original_as_tensor(data, dtype=dtype, device=device)


@functools.wraps(_original_asarray)
def asarray(obj, *, dtype=None, device=None, copy=None, requires_grad=False):
    """torch.asarray, which also builds tensors on stand-ins."""
    if device is not None and is_stand_in(device):
        made = _original_asarray(obj, dtype=dtype, copy=copy).to(device)
        return made.requires_grad_(requires_grad) if requires_grad else made
    return _original_asarray(
        obj, dtype=dtype, device=device, copy=copy, requires_grad=requires_grad
    )


def _patch_parallel() -> None:
    original_scatter = nn.parallel.scatter_gather.scatter

    @functools.wraps(original_scatter)
    def scatter(inputs, target_gpus, dim=0):
        if target_gpus and all(is_stand_in(d) for d in target_gpus):
            return _scatter_obj(inputs, [torch.device(d) for d in target_gpus], dim)
        return original_scatter(inputs, target_gpus, dim)

    nn.parallel.scatter_gather.scatter = scatter
    nn.parallel.scatter = scatter

    dp = nn.DataParallel
    original_init, original_forward = dp.__init__, dp.forward

    @functools.wraps(original_init)
    def init(self, module, device_ids=None, output_device=None, dim=0):
        ids = list(device_ids) if device_ids is not None else None
        if ids and (
            any(is_stand_in(d) for d in ids)
            or (all(isinstance(d, int) for d in ids) and not torch.cuda.is_available())
        ):
            nn.Module.__init__(self)
            torch._C._log_api_usage_once("torch.nn.parallel.DataParallel")
            self.module = module
            self.device_ids = [
                torch.device(TYPE, d) if isinstance(d, int) else torch.device(d) for d in ids
            ]
            self.output_device = torch.device(output_device or self.device_ids[0])
            self.dim = dim
            self.src_device_obj = self.device_ids[0]
            self._stand_ins = True
            return
        original_init(self, module, device_ids, output_device, dim)

    @functools.wraps(original_forward)
    def forward(self, *inputs, **kwargs):
        if not getattr(self, "_stand_ins", False):
            return original_forward(self, *inputs, **kwargs)
        for t in [*self.module.parameters(), *self.module.buffers()]:
            if t.device != self.src_device_obj:
                raise RuntimeError(
                    "module must have its parameters and buffers on device "
                    f"{self.src_device_obj} (device_ids[0]) but found one of them on "
                    f"device: {t.device}"
                )
        if len(self.device_ids) == 1:
            return self.module(*inputs, **kwargs)
        scattered = _scatter_obj(inputs, self.device_ids, self.dim) if inputs else []
        scattered_kw = _scatter_obj(kwargs, self.device_ids, self.dim) if kwargs else []
        n = len(scattered) if scattered else len(self.device_ids)
        if not scattered:
            scattered = [() for _ in range(n)]
        if not scattered_kw:
            scattered_kw = [{} for _ in range(n)]
        replicas = replicate(self.module, self.device_ids[:n])
        outputs = [r(*i, **k) for r, i, k in zip(replicas, scattered, scattered_kw, strict=False)]
        return gather(outputs, self.output_device, self.dim)

    dp.__init__ = init
    dp.forward = forward


# Calls that __torch_function__ handles itself (looked up at call time, so defined here).
_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, _to}
_HOST_ONLY = {
    torch.Tensor.numpy: _numpy,
    torch.Tensor.tolist: _tolist,
    torch.Tensor.new_tensor: _new_tensor,
}


_ORIGINALS: dict[str, object] = {}  # what `enable` replaces, to put back on `disable`


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


def enable(count: int = 2, backing_device: torch.device | None = None) -> None:
    """Turn stand-in devices on; later calls only change the count (see `disable`)."""
    register(backing_device)
    with _lock:
        _state["count"] = max(1, int(count))
        if _state["enabled"]:
            return
        dp = nn.DataParallel
        _ORIGINALS.update(
            tensor=torch.tensor,
            as_tensor=torch.as_tensor,
            asarray=torch.asarray,
            to=torch.Tensor.to,
            scatter=nn.parallel.scatter_gather.scatter,
            parallel_scatter=nn.parallel.scatter,
            dp_init=dp.__init__,
            dp_forward=dp.forward,
        )
        # torch.tensor copies its data below the Python layer, which stand-ins need, and
        # a move onto a stand-in must be a differentiable copy even from a plain tensor.
        torch.tensor, torch.as_tensor, torch.asarray = tensor, as_tensor, asarray
        torch.Tensor.to = _to
        _patch_parallel()
        _state["enabled"] = True


def disable() -> None:
    """Put back every torch function `enable` replaced (for tests: the lab never needs it).
    Tensors already on stand-ins stay there, and the `sim` device type stays registered."""
    with _lock:
        if not _state["enabled"]:
            return
        torch.tensor, torch.as_tensor = _ORIGINALS["tensor"], _ORIGINALS["as_tensor"]
        torch.asarray, torch.Tensor.to = _ORIGINALS["asarray"], _ORIGINALS["to"]
        nn.parallel.scatter_gather.scatter = _ORIGINALS["scatter"]
        nn.parallel.scatter = _ORIGINALS["parallel_scatter"]
        nn.DataParallel.__init__ = _ORIGINALS["dp_init"]
        nn.DataParallel.forward = _ORIGINALS["dp_forward"]
        _state["enabled"] = False


def enabled() -> bool:
    """Return True once stand-in devices are on in this process."""
    return _state["enabled"]


def backing_device() -> torch.device:
    """Return the device stand-in tensors compute on."""
    return _state["backing"]


def synchronize() -> None:
    """Wait for the work queued on the stand-ins: on the GPU behind them, if there is one."""
    if _state["backing"].type == "cuda":
        torch.cuda.synchronize(_state["backing"])
