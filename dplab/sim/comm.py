"""The stand-ins' versions of PyTorch's functional data-parallel API: `torch.cuda.comm`'s
broadcast, broadcast_coalesced, scatter and gather (reduce_add and reduce_add_coalesced are
plain Python in PyTorch and run on stand-ins as they are, but for reduce_add's default
destination, the current device), `nn.parallel`'s parallel_apply and data_parallel, and
the context `torch.cuda.device(d)` around work on a stand-in.

PyTorch's versions call CUDA from C++ (so they raise "Found no NVIDIA driver" without a GPU)
or ask for CUDA streams. Each version here runs only when its tensors or devices are
stand-ins, copies with differentiable `.to` moves, and returns what the CUDA version
returns: the same tensor where it already is on a target device, copies detached from
autograd where the CUDA version detaches them (broadcast_coalesced), and the same errors for
the same mistakes (a CPU tensor to gather, tensors not on devices[0]). Every other call goes
to PyTorch's own. nn.parallel's replicate, scatter and gather need nothing more: they reach
these through `torch.nn.parallel.comm`, which they look up at each call.

Device numbers (`[0, 1]`, as `_get_device_index` makes of any device) mean stand-ins when
the tensors are on stand-ins, or when stand-ins are on and there are not two GPUs.
"""

import functools
import sys

import torch
import torch.cuda.comm as _cuda_comm
from torch._utils import ExceptionWrapper
from torch.nn.parallel import comm as _comm

from dplab.sim.device import TYPE, StandInTensor, count, enabled, is_stand_in
from dplab.sim.gpus import answering, gpu_count, place

_ORIGINAL = {
    name: getattr(_comm, name)
    for name in ("broadcast", "broadcast_coalesced", "reduce_add", "scatter", "gather")
}
_parallel_apply_module = sys.modules["torch.nn.parallel.parallel_apply"]
_data_parallel_module = sys.modules["torch.nn.parallel.data_parallel"]
_ORIGINAL_PARALLEL_APPLY = _parallel_apply_module.parallel_apply
_ORIGINAL_DATA_PARALLEL = _data_parallel_module.data_parallel


def numbers_are_stand_ins() -> bool:
    """Return True when a bare device number names a stand-in: stand-ins are on and there
    are not two GPUs to number (as nn.DataParallel(net, device_ids=[0, 1]) reads them)."""
    return enabled() and gpu_count() < 2


def _on_stand_ins(tensors, devices=()) -> bool:
    """Return True when a call with these tensors and devices is one for the stand-ins."""
    if any(isinstance(t, StandInTensor) for t in tensors):
        return True
    named = [d for d in devices if d is not None and not isinstance(d, int)]
    if answering():  # `cuda:i` names stand-in i (dplab.sim.gpus)
        named = [place(d) for d in named]
    if any(is_stand_in(d) for d in named):
        return True
    numbers = [d for d in devices if isinstance(d, int)]
    return bool(numbers) and not named and numbers_are_stand_ins()


def _device(d, default: int = 0) -> torch.device:
    """The stand-in (or the CPU) a device argument names: a number is a stand-in's, -1 and
    "cpu" the CPU, None the current device (the first stand-in)."""
    if d is None:
        return torch.device(TYPE, default)
    if isinstance(d, int):
        return torch.device("cpu") if d == -1 else torch.device(TYPE, d)
    return torch.device(place(d)) if answering() else torch.device(d)


def _check_index(device: torch.device) -> None:
    if is_stand_in(device) and (device.index or 0) >= count():
        raise RuntimeError("CUDA error: invalid device ordinal")


def _copy_to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` itself where it already is on `device`, else a differentiable copy."""
    _check_index(device)
    return tensor if tensor.device == device else tensor.to(device, copy=True)


def _check_not_cpu(tensors, what: str) -> None:
    for i, t in enumerate(tensors):
        if not is_stand_in(t.device):
            raise RuntimeError(
                f"Expected all {what} tensors to be CUDA tensors, but {what} tensor at index "
                f"{i} has device '{t.device}'"
            )


# ---- torch.cuda.comm ------------------------------------------------------------------------


@functools.wraps(_ORIGINAL["broadcast"])
def broadcast(tensor, devices=None, *, out=None):
    """torch.cuda.comm.broadcast, on stand-ins too."""
    devices = list(devices) if devices is not None else None
    if not _on_stand_ins([tensor, *(out or [])], list(devices or [])):
        return _ORIGINAL["broadcast"](tensor, devices, out=out)
    if not ((devices is None) ^ (out is None)):
        raise RuntimeError(
            "Exactly one of 'devices' and 'out' must be specified, but got "
            f"devices={devices} and out={out}"
        )
    if out is not None:
        _check_not_cpu(out, "output")
        for i, o in enumerate(out):
            if o.shape != tensor.shape:
                raise RuntimeError(
                    "Expected all output tensors to have same shape as the source tensor "
                    f"{list(tensor.shape)}, but output tensor at index {i} has shape "
                    f"{list(o.shape)}"
                )
            o.copy_(tensor)
        return tuple(out)
    return tuple(_copy_to(tensor, _device(d)) for d in devices)


@functools.wraps(_ORIGINAL["reduce_add"])
def reduce_add(inputs, destination=None):
    """torch.cuda.comm.reduce_add (PyTorch's own), where no destination means the current
    device: the first stand-in, as it means GPU 0 on GPUs."""
    if destination is None and _on_stand_ins(list(inputs)):
        destination = 0
    return _ORIGINAL["reduce_add"](inputs, destination)


@functools.wraps(_ORIGINAL["broadcast_coalesced"])
def broadcast_coalesced(tensors, devices, buffer_size=10485760):
    """torch.cuda.comm.broadcast_coalesced, on stand-ins too: devices[0] gets the tensors
    themselves, every other device copies detached from autograd."""
    tensors, devices = list(tensors), list(devices)
    if not _on_stand_ins(tensors, devices):
        return _ORIGINAL["broadcast_coalesced"](tensors, devices, buffer_size)
    targets = [_device(d) for d in devices]
    if any(t.device != targets[0] for t in tensors):
        raise RuntimeError(f"All tensors must be on devices[0]: {targets[0].index}")
    outputs = [list(tensors)]
    for device in targets[1:]:
        _check_index(device)
        with torch.no_grad():
            outputs.append([t.to(device, copy=True) for t in tensors])
    return outputs


@functools.wraps(_ORIGINAL["scatter"])
def scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
    """torch.cuda.comm.scatter, on stand-ins too (streams have nothing to do here)."""
    devices = list(devices) if devices is not None else None
    if not _on_stand_ins([tensor, *(out or [])], list(devices or [])):
        return _ORIGINAL["scatter"](tensor, devices, chunk_sizes, dim, streams, out=out)
    if out is not None:
        if devices is not None:
            raise RuntimeError(
                "'devices' must not be specified when 'out' is specified, but got "
                f"devices={devices}"
            )
        if chunk_sizes is not None:
            raise RuntimeError(
                "'chunk_sizes' must not be specified when 'out' is specified, but got "
                f"chunk_sizes={chunk_sizes}"
            )
        _check_not_cpu(out, "output")
        parts = torch.split(tensor, [o.shape[dim] for o in out], dim=dim)
        for o, part in zip(out, parts, strict=True):
            o.copy_(part)
        return tuple(out)
    devices = [_device(d) for d in devices]
    if chunk_sizes is None:
        parts = torch.chunk(tensor, len(devices), dim=dim)
    else:
        chunk_sizes = list(chunk_sizes)
        if len(chunk_sizes) != len(devices):
            raise RuntimeError(
                f"Expected devices and chunk_sizes to be of same length, but got "
                f"len(devices) = {len(devices)} and len(chunk_sizes) = {len(chunk_sizes)}"
            )
        parts = torch.split(tensor, chunk_sizes, dim=dim)
    return tuple(_copy_to(p, d) for p, d in zip(parts, devices, strict=False))


@functools.wraps(_ORIGINAL["gather"])
def gather(tensors, dim=0, destination=None, *, out=None):
    """torch.cuda.comm.gather, on stand-ins too: the pieces concatenated on `destination`
    (the first stand-in unless told; -1 or "cpu" for the CPU)."""
    tensors = list(tensors)
    on = _on_stand_ins([*tensors, *([out] if out is not None else [])])
    if not on:
        return _ORIGINAL["gather"](tensors, dim, destination, out=out)
    _check_not_cpu(tensors, "input")
    if out is not None:
        if destination is not None:
            raise RuntimeError(
                "'destination' must not be specified when 'out' is specified, but got "
                f"destination={destination}"
            )
        whole = torch.cat([t.to(out.device) for t in tensors], dim=dim)
        out.copy_(whole)
        return out
    target = _device(destination)
    _check_index(target)
    return torch.cat([t.to(target) for t in tensors], dim=dim)


# ---- nn.parallel ----------------------------------------------------------------------------


def _a_tensor(obj):
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, list | tuple):
        for o in obj:
            found = _a_tensor(o)
            if found is not None:
                return found
    if isinstance(obj, dict):
        return _a_tensor(list(obj.values()))
    return None


@functools.wraps(_ORIGINAL_PARALLEL_APPLY)
def parallel_apply(modules, inputs, kwargs_tup=None, devices=None):
    """nn.parallel.parallel_apply, on stand-ins too: each module on its input, in turn
    (one computing device has nothing to run in parallel); an exception in a replica is
    raised again as PyTorch raises it, naming the replica and its device."""
    found = [_a_tensor(i) for i in inputs]
    if not _on_stand_ins([t for t in found if t is not None], list(devices or [])):
        return _ORIGINAL_PARALLEL_APPLY(modules, inputs, kwargs_tup, devices)
    if len(modules) != len(inputs):
        raise AssertionError(
            f"The number of modules {len(modules)} is not equal to "
            f"the number of inputs {len(inputs)}"
        )
    if kwargs_tup is not None and len(modules) != len(kwargs_tup):
        raise AssertionError(
            f"The number of modules {len(modules)} is not equal to "
            f"the number of kwargs_tup {len(kwargs_tup)}"
        )
    if devices is not None and len(modules) != len(devices):
        raise AssertionError(
            f"The number of modules {len(modules)} is not equal to "
            f"the number of devices {len(devices)}"
        )
    kwargs_tup = kwargs_tup if kwargs_tup is not None else [{}] * len(modules)
    devices = list(devices) if devices is not None else [None] * len(modules)
    outputs = []
    for i, (module, given, kwargs, device) in enumerate(
        zip(modules, inputs, kwargs_tup, devices, strict=True)
    ):
        index = device if isinstance(device, int) or device is None else _device(device).index
        if index is None:
            tensor = found[i]
            if tensor is None:
                raise RuntimeError(
                    f"in replica {i}, no device was provided and no tensor input was found; "
                    "device cannot be resolved"
                )
            index = tensor.get_device()
        try:
            args = given if isinstance(given, list | tuple) else (given,)
            outputs.append(module(*args, **kwargs))
        except Exception:
            ExceptionWrapper(where=f"in replica {i} on device {index}").reraise()
    return outputs


@functools.wraps(_ORIGINAL_DATA_PARALLEL)
def data_parallel(module, inputs, device_ids=None, output_device=None, dim=0, module_kwargs=None):
    """nn.parallel.data_parallel, on stand-ins too (with every stand-in when no device_ids
    are given and there are not two GPUs)."""
    held = [*module.parameters(), *module.buffers()]
    ids = list(device_ids) if device_ids is not None else None
    if ids is None and numbers_are_stand_ins():
        ids = list(range(count()))
    if ids is None or not _on_stand_ins(held[:1], ids):
        return _ORIGINAL_DATA_PARALLEL(
            module, inputs, device_ids, output_device, dim, module_kwargs
        )
    from torch.nn.parallel.replicate import replicate
    from torch.nn.parallel.scatter_gather import gather as gather_outputs
    from torch.nn.parallel.scatter_gather import scatter_kwargs

    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    targets = [_device(d) for d in ids]
    output = _device(output_device) if output_device is not None else targets[0]
    for t in held:
        if t.device != targets[0]:
            raise RuntimeError(
                "module must have its parameters and buffers on device "
                f"{targets[0]} (device_ids[0]) but found one of them on device: {t.device}"
            )
    inputs, module_kwargs = scatter_kwargs(inputs, module_kwargs, targets, dim)
    if not inputs and not module_kwargs:
        inputs, module_kwargs = ((),), ({},)
    if len(targets) == 1:
        return module(*inputs[0], **module_kwargs[0])
    used = targets[: len(inputs)]
    replicas = replicate(module, used)
    outputs = parallel_apply(replicas, inputs, module_kwargs, used)
    return gather_outputs(outputs, output, dim)


class device(torch.cuda.device):  # noqa: N801  (torch's name, so isinstance keeps working)
    """torch.cuda.device, which also takes a stand-in: then a context that changes nothing,
    as every stand-in is reached by its name and none is "current"."""

    def __init__(self, device) -> None:
        if is_stand_in(device):
            self.idx, self.prev_idx = -1, -1  # torch's own no-op, as for device(-1)
            return
        super().__init__(device)


def _no_stream(original):
    @functools.wraps(original)
    def get_stream(device):
        # A copy from the CPU onto stand-ins needs no CUDA stream (there may be no GPU of
        # that number, or none at all).
        return None if numbers_are_stand_ins() else original(device)

    return get_stream


_PATCHES = [
    (_comm, "broadcast", broadcast),
    (_comm, "broadcast_coalesced", broadcast_coalesced),
    (_comm, "reduce_add", reduce_add),
    (_cuda_comm, "reduce_add", reduce_add),
    (_comm, "scatter", scatter),
    (_comm, "gather", gather),
    (_cuda_comm, "broadcast", broadcast),
    (_cuda_comm, "broadcast_coalesced", broadcast_coalesced),
    (_cuda_comm, "scatter", scatter),
    (_cuda_comm, "gather", gather),
    (torch.nn.parallel, "parallel_apply", parallel_apply),
    (_parallel_apply_module, "parallel_apply", parallel_apply),
    (_data_parallel_module, "parallel_apply", parallel_apply),
    (torch.nn.parallel, "data_parallel", data_parallel),
    (torch.cuda, "device", device),
    (_data_parallel_module, "data_parallel", data_parallel),
]


def patch_comm() -> list[tuple[object, str, object]]:
    """Put the stand-ins' versions in place; return what they replaced, to put back."""
    from torch.nn.parallel import _functions

    replaced = [(owner, name, getattr(owner, name)) for owner, name, _ in _PATCHES]
    replaced.append((_functions, "_get_stream", _functions._get_stream))
    for owner, name, new in _PATCHES:
        setattr(owner, name, new)
    _functions._get_stream = _no_stream(_functions._get_stream)
    return replaced


def unpatch_comm(replaced: list[tuple[object, str, object]]) -> None:
    """Put back what `patch_comm` replaced."""
    for owner, name, old in replaced:
        setattr(owner, name, old)
