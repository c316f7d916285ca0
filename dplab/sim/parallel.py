"""The stand-ins' versions of what PyTorch does only with CUDA devices: `nn.parallel`'s
scatter, replicate and gather (so `nn.DataParallel` runs on stand-ins), and the factories
`torch.tensor`, `torch.as_tensor` and `torch.asarray`, which copy below the Python layer."""

import functools

import torch
from torch import nn

from dplab.sim.device import TYPE, count, enabled, is_stand_in
from dplab.sim.gpus import answering, gpu_count, place

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


def _stand_in_ids(device_ids) -> list[torch.device] | None:
    """Return the devices nn.DataParallel should use when they are stand-ins (or plain
    numbers with no CUDA to number), as devices; None when the original should run."""
    ids = list(device_ids) if device_ids is not None else None
    if ids is None and enabled() and gpu_count() < 2:
        # Without device_ids nn.DataParallel takes every GPU there is: here, every stand-in.
        ids = [torch.device(TYPE, i) for i in range(count())]
    if ids and answering():  # `cuda:i` names stand-in i (dplab.sim.gpus)
        ids = [place(d) for d in ids]
    if ids and (
        any(is_stand_in(d) for d in ids)
        or (all(isinstance(d, int) for d in ids) and enabled() and gpu_count() < 2)
    ):
        return [torch.device(TYPE, d) if isinstance(d, int) else torch.device(d) for d in ids]
    return None


def _init_on_stand_ins(
    dp: nn.DataParallel, module: nn.Module, device_ids: list[torch.device], output_device, dim: int
) -> None:
    """Set up `dp` as nn.DataParallel.__init__ would, on stand-ins (which it refuses)."""
    nn.Module.__init__(dp)
    torch._C._log_api_usage_once("torch.nn.parallel.DataParallel")
    dp.module = module
    dp.device_ids = device_ids
    dp.output_device = torch.device(output_device or dp.device_ids[0])
    dp.dim = dim
    dp.src_device_obj = dp.device_ids[0]
    dp._stand_ins = True


def _forward_on_stand_ins(dp: nn.DataParallel, inputs: tuple, kwargs: dict):
    """Run nn.DataParallel's forward on stand-ins: scatter, replicate, apply, gather."""
    for t in [*dp.module.parameters(), *dp.module.buffers()]:
        if t.device != dp.src_device_obj:
            raise RuntimeError(
                "module must have its parameters and buffers on device "
                f"{dp.src_device_obj} (device_ids[0]) but found one of them on "
                f"device: {t.device}"
            )
    if len(dp.device_ids) == 1:
        return dp.module(*inputs, **kwargs)
    scattered = _scatter_obj(inputs, dp.device_ids, dp.dim) if inputs else []
    scattered_kw = _scatter_obj(kwargs, dp.device_ids, dp.dim) if kwargs else []
    n = len(scattered) if scattered else len(dp.device_ids)
    if not scattered:
        scattered = [() for _ in range(n)]
    if not scattered_kw:
        scattered_kw = [{} for _ in range(n)]
    replicas = replicate(dp.module, dp.device_ids[:n])
    outputs = [r(*i, **k) for r, i, k in zip(replicas, scattered, scattered_kw, strict=False)]
    return gather(outputs, dp.output_device, dp.dim)


def _patch_scatter() -> None:
    """Make nn.parallel's scatter split inputs onto stand-ins too."""
    original_scatter = nn.parallel.scatter_gather.scatter

    @functools.wraps(original_scatter)
    def scatter(inputs, target_gpus, dim=0):
        if target_gpus and all(is_stand_in(d) for d in target_gpus):
            return _scatter_obj(inputs, [torch.device(d) for d in target_gpus], dim)
        return original_scatter(inputs, target_gpus, dim)

    nn.parallel.scatter_gather.scatter = scatter
    nn.parallel.scatter = scatter


def _patch_data_parallel() -> None:
    """Make nn.DataParallel accept stand-ins and run on them; other devices as before."""
    dp = nn.DataParallel
    original_init, original_forward = dp.__init__, dp.forward

    @functools.wraps(original_init)
    def init(self, module, device_ids=None, output_device=None, dim=0):
        ids = _stand_in_ids(device_ids)
        if ids is not None:
            _init_on_stand_ins(self, module, ids, output_device, dim)
            return
        original_init(self, module, device_ids, output_device, dim)

    @functools.wraps(original_forward)
    def forward(self, *inputs, **kwargs):
        if not getattr(self, "_stand_ins", False):
            return original_forward(self, *inputs, **kwargs)
        return _forward_on_stand_ins(self, inputs, kwargs)

    dp.__init__ = init
    dp.forward = forward


def _patch_parallel() -> None:
    """Let nn.parallel's scatter and nn.DataParallel work on stand-ins."""
    _patch_scatter()
    _patch_data_parallel()
