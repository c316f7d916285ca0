"""torch.cuda as a machine with the stand-ins for its GPUs: what a program may ask of CUDA
(how many GPUs, their names, the current one, streams, events, autocast) answers for the
stand-ins, and `cuda:i` names stand-in i, while `answering_as_gpus()` is on.

The grader turns it on around each case of the notebooks whose devices are stand-ins, so that
`if torch.cuda.device_count() > 1: net = nn.DataParallel(net)`, `.cuda()` and
`torch.device("cuda:1")` do there what they do on a server with that many GPUs. A number past
the last stand-in fails as CUDA fails for a GPU that is not there. A tensor placed on `cuda:i`
lives on `sim:i`, and says so: `x.device` and `x.is_cuda` are what a program cannot be kept
from seeing. `torch.autocast("cuda")` computes in float16 (or bfloat16) on the stand-ins, as
autocast does on the CPU, and `GradScaler("cuda")` scales on them as on GPUs.
"""

import contextlib
import time
from collections.abc import Iterator
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

from dplab.sim.device import _MOVES, _state, count, is_stand_in, synchronize

_cuda = torch.cuda
_REAL = {
    name: getattr(_cuda, name)
    for name in ("device_count", "is_available", "get_rng_state", "set_rng_state")
}
_MEMORY = 16 * 2**30  # what each stand-in says it holds, in bytes
_on = {"depth": 0, "current": 0}
_saved: list[tuple[object, str, object]] = []


def gpu_count() -> int:
    """Return torch.cuda.device_count(), but the machine's real number of GPUs while it
    answers for the stand-ins (the lab's own choice of devices needs the real one)."""
    asked = _cuda.device_count
    return _REAL["device_count"]() if getattr(asked, "stand_ins", False) else asked()


def gpus_available() -> bool:
    """Return torch.cuda.is_available(), but the real answer while it answers for stand-ins."""
    asked = _cuda.is_available
    return _REAL["is_available"]() if getattr(asked, "stand_ins", False) else asked()


def answering() -> bool:
    """Return True while torch.cuda answers for the stand-ins."""
    return _on["depth"] > 0


def _no_such_gpu() -> RuntimeError:
    return RuntimeError(
        "CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously "
        "reported at some other API call, so the stacktrace below might be incorrect."
    )


def _index(device=None) -> int:
    """Return the number of the stand-in a CUDA device argument names, or raise as CUDA does."""
    if device is None:
        index = _on["current"]
    elif isinstance(device, int):
        index = device
    else:
        named = torch.device(device)
        index = _on["current"] if named.index is None else named.index
    if not 0 <= index < count():
        raise _no_such_gpu()
    return index


def place(device: object) -> object:
    """Return the stand-in for a CUDA device (a string, a torch.device); others as they are."""
    if isinstance(device, str | torch.device):
        try:
            named = torch.device(device)
        except RuntimeError:
            return device
        if named.type == "cuda":
            return torch.device("sim", _index(named))
    return device


class _CudaIsStandIns(TorchFunctionMode):
    """`cuda:i` names stand-in i: in a factory's `device=`, `.to(...)`, `.cuda(i)`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, _OPERATORS):  # what the stand-ins themselves run
            return func(*args, **kwargs)
        device = kwargs.get("device")
        if device is not None:  # a bare number names a GPU, as torch.device(1) does
            named = torch.device("cuda", device) if isinstance(device, int) else device
            kwargs = {**kwargs, "device": place(named)}
        if func is _TENSOR_CUDA:  # .cuda(), .cuda(1), .cuda("cuda:1")
            given = args[1] if len(args) > 1 else kwargs.get("device")
            if isinstance(given, torch.device) and is_stand_in(given):
                target = given
            else:
                target = torch.device("sim", _index(given))
            return args[0].to(target, non_blocking=kwargs.get("non_blocking", False))
        if func in _MOVES and len(args) > 1:
            first = args[1]  # .to(1) names GPU 1 too
            if isinstance(first, int) and not isinstance(first, bool):
                first = torch.device("cuda", first)
            args = (args[0], place(first), *[place(a) for a in args[2:]])
        return func(*args, **kwargs)


_TENSOR_CUDA = torch.Tensor.cuda
_OPERATORS = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)


class Stream:
    """A CUDA stream on a stand-in: work on stand-ins runs in order, so it has nothing to
    wait for, and says so."""

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = torch.device("cuda", _index(_device_number(device)))
        self.priority = priority

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        synchronize()

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device={self.device} (a stand-in's)>"


def _device_number(device):
    """A device argument of torch.cuda's stream calls: stand-ins by their number too."""
    if isinstance(device, torch.device | str) and is_stand_in(device):
        return torch.device(device).index or 0
    return device


class Event:
    """A CUDA event on a stand-in: it records when it was reached, for `elapsed_time`."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, **kwargs) -> None:
        self.enable_timing = enable_timing
        self.at: float | None = None

    def record(self, stream=None) -> None:
        synchronize()
        self.at = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        synchronize()

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event to `end`, both recorded (as CUDA asks)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.at - self.at) * 1000.0


_streams: dict[int, Stream] = {}
_current_streams: dict[int, Stream] = {}


def _default_stream(device=None) -> Stream:
    index = _index(_device_number(device))
    if index not in _streams:
        _streams[index] = Stream(index)
    return _streams[index]


def _current_stream(device=None) -> Stream:
    index = _index(_device_number(device))
    return _current_streams.get(index) or _default_stream(index)


@contextlib.contextmanager
def _stream(stream: Stream | None) -> Iterator[None]:
    """torch.cuda.stream(s): `s` is the current stream of its device while the block runs."""
    if stream is None:
        yield
        return
    index = stream.device.index or 0
    before = _current_streams.get(index)
    _current_streams[index] = stream
    try:
        yield
    finally:
        if before is None:
            _current_streams.pop(index, None)
        else:
            _current_streams[index] = before


def _set_device(device) -> None:
    _on["current"] = _index(_device_number(device))


def _properties(device=None) -> SimpleNamespace:
    _index(_device_number(device))
    return SimpleNamespace(
        name="Stand-in GPU", total_memory=_MEMORY, major=8, minor=0, multi_processor_count=1
    )


def _synchronize(device=None) -> None:
    _index(_device_number(device))
    synchronize()


def _get_rng_state(device="cuda") -> torch.Tensor:
    """The random state of the device the stand-ins compute on (torch.random.fork_rng)."""
    _index(_device_number(device))
    backing = _state["backing"]
    return _REAL["get_rng_state"](backing) if backing.type == "cuda" else torch.get_rng_state()


def _set_rng_state(new_state: torch.Tensor, device="cuda") -> None:
    _index(_device_number(device))
    backing = _state["backing"]
    if backing.type == "cuda":
        _REAL["set_rng_state"](new_state, backing)
    else:
        torch.set_rng_state(new_state)


def _nothing_used(device=None) -> int:
    _index(_device_number(device))
    return 0


def _answers(device_class: type) -> dict:
    """Return what torch.cuda answers for the stand-ins, by name."""

    class device(device_class):  # noqa: N801  (torch's name: isinstance keeps working)
        """torch.cuda.device(i): stand-in i is the current device while the block runs."""

        def __init__(self, device) -> None:
            self.idx = -1 if device is None or device == -1 else _index(_device_number(device))
            self.prev_idx = -1

        def __enter__(self) -> None:
            self.prev_idx = _on["current"]
            if self.idx != -1:
                _on["current"] = self.idx

        def __exit__(self, *exc) -> bool:
            _on["current"] = self.prev_idx
            return False

    answers = {
        "device_count": count,
        "is_available": lambda: True,
        "current_device": lambda: _on["current"],
        "set_device": _set_device,
        "device": device,
        "synchronize": _synchronize,
        "get_device_name": lambda device=None: _properties(device).name,
        "get_device_properties": _properties,
        "get_device_capability": lambda device=None: (8, 0) if _properties(device) else None,
        "Stream": Stream,
        "Event": Event,
        "current_stream": _current_stream,
        "default_stream": _default_stream,
        "stream": _stream,
        "get_rng_state": _get_rng_state,
        "set_rng_state": _set_rng_state,
        "memory_allocated": _nothing_used,
        "max_memory_allocated": _nothing_used,
        "memory_reserved": _nothing_used,
        "reset_peak_memory_stats": lambda device=None: None,
        "mem_get_info": lambda device=None: (_MEMORY - _nothing_used(device), _MEMORY),
    }
    for answer in answers.values():
        with contextlib.suppress(AttributeError, TypeError):
            answer.stand_ins = True
    return answers


# ---- autocast ------------------------------------------------------------------------------

_autocast = torch.amp.autocast
_AUTOCAST = {"enter": _autocast.__enter__, "exit": _autocast.__exit__}


def _enter_autocast(self):
    """autocast("cuda").__enter__, and with it CPU autocast in the same precision: to the
    autocast machinery a stand-in's tensor is a CPU tensor."""
    entered = _AUTOCAST["enter"](self)
    if self.device == "cuda":
        cpu = torch.autocast(
            "cpu", dtype=self.fast_dtype, enabled=self._enabled, cache_enabled=self._cache_enabled
        )
        cpu.__enter__()
        self._stand_ins = cpu
    return entered


def _exit_autocast(self, *exc):
    cpu = self.__dict__.pop("_stand_ins", None)
    if cpu is not None:
        cpu.__exit__(*exc)
    return _AUTOCAST["exit"](self, *exc)


# ---- switching ---------------------------------------------------------------------------


@contextlib.contextmanager
def answering_as_gpus() -> Iterator[None]:
    """While the block runs, torch.cuda answers for the stand-ins and `cuda:i` names stand-in
    i (see the module docstring). Blocks may nest; the outermost one puts torch back."""
    if _on["depth"] == 0:
        _switch_on()
    _on["depth"] += 1
    mode = _CudaIsStandIns()
    try:
        with mode:
            yield
    finally:
        _on["depth"] -= 1
        if _on["depth"] == 0:
            _switch_off()


def _switch_on() -> None:
    answers = _answers(_cuda.device)
    _saved[:] = [(_cuda, name, getattr(_cuda, name)) for name in answers]
    _saved.extend(
        [(_autocast, "__enter__", _autocast.__enter__), (_autocast, "__exit__", _autocast.__exit__)]
    )
    for name, answer in answers.items():
        setattr(_cuda, name, answer)
    _autocast.__enter__, _autocast.__exit__ = _enter_autocast, _exit_autocast
    _on["current"] = 0
    _current_streams.clear()


def _switch_off() -> None:
    for owner, name, old in reversed(_saved):
        setattr(owner, name, old)
    _saved.clear()
