"""Stand-in devices: `sim:0`, `sim:1`, ... that behave like separate GPUs on one machine.
The bottom of dplab: it imports torch alone.

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
  they get plain Python equivalents (split and copy, replicate, apply in turn, gather);
  so do `torch.cuda.comm`'s broadcast, scatter and gather and `nn.parallel`'s
  parallel_apply and data_parallel (dplab.sim.comm), through which `nn.parallel.replicate`
  and `nn.parallel.gather` run unchanged;
- while `answering_as_gpus()` is on (the grader turns it on around the cases of the notebooks
  that train on stand-ins), torch.cuda answers for the stand-ins: device_count, names,
  the current device, streams and events, `cuda:i` as stand-in i, and autocast("cuda")
  (dplab.sim.gpus).

What it cannot do: to PyTorch's C++ core a stand-in tensor is a CPU tensor, so the few
composite operations that build tensors from `self.options()` before any Python code runs
(`F.one_hot` is one) make CPU tensors and then fail with a mixed-device error; and
`untyped_storage()` has nothing to show.
"""

from dplab.sim.device import (
    TYPE,
    backing,
    backing_device,
    enabled,
    is_stand_in,
    register,
    synchronize,
)
from dplab.sim.gpus import answering_as_gpus, gpu_count, gpus_available
from dplab.sim.switch import disable, enable

__all__ = [
    "TYPE",
    "answering_as_gpus",
    "backing",
    "backing_device",
    "disable",
    "enable",
    "enabled",
    "gpu_count",
    "gpus_available",
    "is_stand_in",
    "register",
    "synchronize",
]
