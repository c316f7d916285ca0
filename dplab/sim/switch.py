"""Switch the stand-ins on (and off, for tests): what that changes in torch."""

import torch
from torch import nn

from dplab.sim.comm import patch_comm, unpatch_comm
from dplab.sim.device import _lock, _state, _to, register
from dplab.sim.parallel import _patch_parallel, as_tensor, asarray, tensor

_ORIGINALS: dict[str, object] = {}  # what `enable` replaces, to put back on `disable`
_COMM: list = []  # what dplab.sim.comm replaced


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
        _COMM[:] = patch_comm()
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
        unpatch_comm(_COMM)
        _COMM.clear()
        _state["enabled"] = False
