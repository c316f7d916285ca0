"""Which devices the lab trains on, and device-agnostic stand-ins for CUDA-only calls.

The book's multi-GPU code wants at least two GPUs. Most students have none or one, so the
lab hands out *stand-in* devices when real ones run out. Every choice of device in the lab
goes through `lab_device`, so this file is the one place that decides.
"""

import torch
from torch import Tensor

_told_about_stand_ins = False


def num_gpus() -> int:
    """Return the number of CUDA GPUs this process can use."""
    return torch.cuda.device_count()


def stand_in_device() -> torch.device:
    """Return the device that backs stand-ins: the one GPU if there is one, else the CPU."""
    return torch.device("cuda:0") if num_gpus() > 0 else torch.device("cpu")


def _tell_about_stand_ins() -> None:
    global _told_about_stand_ins
    if _told_about_stand_ins:
        return
    _told_about_stand_ins = True
    count = num_gpus()
    backing = stand_in_device()
    have = "no GPU" if count == 0 else f"only {count} GPU" + ("s" if count > 1 else "")
    print(
        f"dplab: this machine has {have}, so devices numbered {count} and up are stand-ins "
        f"that all compute on {backing}. The multi-device code runs and gives the same "
        "numbers as on real GPUs, but it is not faster."
    )


def lab_device(i: int = 0) -> torch.device:
    """Return device number `i` for the lab: GPU `i` if it exists, else a stand-in."""
    if i < 0:
        raise ValueError(f"device numbers start at 0, got {i}")
    if i < num_gpus():
        return torch.device(f"cuda:{i}")
    _tell_about_stand_ins()
    return stand_in_device()


def lab_devices(n: int = 2) -> list[torch.device]:
    """Return `n` devices to train on: real GPUs while they last, then stand-ins."""
    if n < 1:
        raise ValueError(f"ask for at least one device, got {n}")
    return [lab_device(i) for i in range(n)]


def try_gpu(i: int = 0) -> torch.device:
    """Return GPU `i` if it exists; otherwise the lab's stand-in device."""
    return lab_device(i)


def try_all_gpus() -> list[torch.device]:
    """Return every GPU, or `[cpu]` when there is none."""
    gpus = [torch.device(f"cuda:{i}") for i in range(num_gpus())]
    return gpus if gpus else [torch.device("cpu")]


def scatter(tensor: Tensor, devices: list[torch.device]) -> tuple[Tensor, ...]:
    """Split `tensor` along dim 0 as `nn.parallel.scatter` does, on any kind of device.

    `nn.parallel.scatter` accepts CUDA devices only; this one also takes the CPU and
    repeated devices. Shard sizes follow `torch.chunk`, so 5 rows over 2 devices give 3 and 2.
    """
    chunks = torch.chunk(tensor, len(devices), dim=0)
    return tuple(chunk.to(device) for chunk, device in zip(chunks, devices, strict=False))


def synchronize(devices: torch.device | list[torch.device] | None = None) -> None:
    """Wait for queued work on the given CUDA devices; a no-op for other devices."""
    if not torch.cuda.is_available():
        return
    if devices is None:
        torch.cuda.synchronize()
        return
    for device in devices if isinstance(devices, list | tuple) else [devices]:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
