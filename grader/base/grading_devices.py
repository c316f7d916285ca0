"""The devices the checks run on: always two distinct ones, whatever DPLAB_DEVICES says.

Two GPUs where there are two (unless DPLAB_DEVICES asks for stand-ins), otherwise the lab's
stand-ins (dplab.devices.use_stand_ins). So a placement mistake costs the same on a laptop as
on a GPU server, and `DPLAB_DEVICES=cpu` changes no grade.
"""

import torch

from dplab import devices

DEVICES = 2  # the exercises train on two devices, like the book


def grading_mode() -> str:
    """Return the device mode the checks run in: "real" with two GPUs or more (unless
    DPLAB_DEVICES asks for stand-ins), otherwise "stand-in"; never "cpu", whose repeated
    device would hide a missing `.to(device)`."""
    mode = devices.device_mode()
    return "real" if mode in ("auto", "real") and devices.num_gpus() >= 2 else "stand-in"


def grading_devices(n: int = 2) -> list[torch.device]:
    """Return the `n` distinct devices the checks run on (see `grading_mode`), with float32
    computed in full on CUDA, so that a GPU server grades as a laptop does."""
    devices.exact_float32()
    return devices.lab_devices(n, grading_mode())
