"""Which devices the lab trains on: real GPUs, or stand-ins when there are too few.

The book's multi-GPU code wants at least two GPUs. Most students have none or one, so the
lab hands out *stand-in* devices, `sim:0`, `sim:1`, ... (see dplab.sim): distinct devices
that compute on the CPU, or on the one GPU, and fail as real GPUs do when code mixes them.
Every choice of device in the lab goes through `lab_device`, so this file is the one place
that decides. Two environment variables change the choice:

    DPLAB_DEVICES    auto (default): two or more GPUs are used as they are; with fewer,
                     stand-ins. real: GPUs only, and the CPU where a GPU is missing (the
                     book's behaviour). stand-in: stand-ins even with GPUs. cpu: everything
                     on the CPU, the same device repeated.
    DPLAB_STAND_INS  how many stand-ins there are (default 2).

Both editions of the book are at home here: `try_gpu` and `try_all_gpus` (the Chinese 2.0
edition), and `gpu`, `cpu` and `num_gpus` (the English 1.0 edition) all speak of the lab's
devices. The CUDA calls that the book's code for these sections makes behave as follows where
the lab's devices are stand-ins (or the CPU), so that code which runs on two GPUs runs here too:

    torch.cuda.device_count()  the real number of GPUs (0 on a laptop): the lab never pretends
    torch.cuda.is_available()  the real answer (while the grader runs the cases of these
                               notebooks on stand-ins, the stand-ins': see dplab.sim.gpus)
    torch.cuda.synchronize()   waits for the device the stand-ins compute on (the one GPU),
                               and returns at once on the CPU, where nothing is queued; given
                               a stand-in, it waits for the device behind it
    torch.device('cuda:1'), tensor.cuda(1)
                               unchanged: a CUDA device, which fails without GPUs as PyTorch
                               says. The lab's checks hand your functions their devices.

The stand-ins switch on in one place, `use_stand_ins()`, which the lab calls when it first
hands out a stand-in (from `try_gpu`, `try_all_gpus` or `gpu`) and which prints a line saying
so. (The grader always checks on two distinct devices, whatever DPLAB_DEVICES says: see
grader.base.grading_devices.)
"""

import torch
from torch import Tensor

import labtext
from dplab import settings, sim
from labtext import N_, _

MODES = ("auto", "real", "stand-in", "cpu")
_told: set[str] = set()


def num_gpus() -> int:
    """Return the number of CUDA GPUs this process can use (d2l 1.0's `num_gpus`); the real
    number while torch.cuda answers for the stand-ins (dplab.sim.gpus)."""
    return sim.gpu_count()


def cpu() -> torch.device:
    """Return the CPU (d2l 1.0's `cpu`)."""
    return torch.device("cpu")


def device_mode() -> str:
    """Return how the lab picks devices (see the module docstring)."""
    mode = settings.DEVICES.get().strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(
            _("DPLAB_DEVICES must be one of {modes}, not {mode}").format(
                modes=", ".join(MODES), mode=repr(mode)
            )
        )
    return mode


def stand_in_count() -> int:
    """Return how many stand-in devices the lab offers (DPLAB_STAND_INS, default 2)."""
    value = settings.STAND_INS.get()
    try:
        count = int(value)
    except ValueError:
        raise ValueError(
            _("DPLAB_STAND_INS must be a whole number, not {value}").format(value=repr(value))
        ) from None
    if count < 1:
        raise ValueError(_("DPLAB_STAND_INS must be at least 1, not {count}").format(count=count))
    return count


def using_stand_ins(mode: str | None = None) -> bool:
    """Return True when the lab's devices are stand-ins (in `mode`, default DPLAB_DEVICES)."""
    mode = mode or device_mode()
    return mode == "stand-in" or (mode == "auto" and num_gpus() < 2)


def _tell(what: str, message: str, **fields: object) -> None:
    """Print `message` (marked with N_) once per process for each `what`, in the language of
    whoever runs it (labtext.default_language: the notebook's in a kernel, the command line's in
    the grader), not in that of the submission being graded at the moment."""
    if what not in _told:
        _told.add(what)
        print(labtext.translate(labtext.default_language(), message).format(**fields))


def exact_float32() -> None:
    """Turn off TensorFloat-32 on CUDA, which convolutions use by default from Ampere on: it
    keeps 10 bits of a float32's mantissa, so a step split across devices and the same step
    on one differ by about 1e-3, where the checks and the stand-ins' promise ask for float32's
    own rounding. (Where the lab trains on two real GPUs, it stays on.)"""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def use_stand_ins(count: int = 2) -> None:
    """Switch the stand-in devices sim:0 ... sim:count-1 on (and the book's
    `torch.cuda.synchronize()` with them), saying so once: from here on, tensors may live on
    them. The lab calls it when it first hands out a stand-in."""
    sim.enable(count)
    install_cuda_shims()
    backing = sim.backing_device()
    if backing.type == "cuda":
        exact_float32()  # "the numbers come out the same" as on one device
    gpus = num_gpus()
    if gpus == 0:
        said = N_(
            "dplab: this machine has no GPU, so the lab gives you stand-in devices sim:0, "
            "sim:1, ... that compute on {backing}. Code that mixes them fails as it would on "
            "real GPUs, and the numbers come out the same; only the speed differs."
        )
    elif gpus == 1:
        said = N_(
            "dplab: this machine has 1 GPU, so the lab gives you stand-in devices sim:0, "
            "sim:1, ... that compute on {backing}. Code that mixes them fails as it would on "
            "real GPUs, and the numbers come out the same; only the speed differs."
        )
    else:
        said = N_(
            "dplab: this machine has {count} GPUs, so the lab gives you stand-in devices sim:0, "
            "sim:1, ... that compute on {backing}. Code that mixes them fails as it would on "
            "real GPUs, and the numbers come out the same; only the speed differs."
        )
    _tell(f"stand-ins on {backing}", said, count=gpus, backing=backing)


def device_count() -> int:
    """Return how many devices the lab trains on by default: every GPU when there are two
    or more, otherwise the number of stand-ins."""
    if device_mode() == "cpu":
        return stand_in_count()
    return stand_in_count() if using_stand_ins() else max(1, num_gpus())


def lab_device(i: int = 0, mode: str | None = None) -> torch.device:
    """Return device number `i` for the lab (in `mode`; see the module docstring)."""
    if i < 0:
        raise ValueError(_("device numbers start at 0, got {i}").format(i=i))
    mode = mode or device_mode()
    if mode == "cpu":
        _tell("cpu", N_("dplab: DPLAB_DEVICES=cpu, so every device is the CPU."))
        install_cuda_shims()
        return torch.device("cpu")
    if not using_stand_ins(mode):
        return torch.device(f"cuda:{i}") if i < num_gpus() else torch.device("cpu")
    use_stand_ins(max(stand_in_count(), i + 1))
    return torch.device("sim", i)


def lab_devices(n: int = 2, mode: str | None = None) -> list[torch.device]:
    """Return `n` devices to train on (in `mode`, default DPLAB_DEVICES)."""
    if n < 1:
        raise ValueError(_("ask for at least one device, got {n}").format(n=n))
    return [lab_device(i, mode) for i in range(n)]


def try_gpu(i: int = 0) -> torch.device:
    """Return GPU `i` if it exists; otherwise the lab's device `i` (a stand-in, or the CPU)."""
    return lab_device(i)


def gpu(i: int = 0) -> torch.device:
    """Return GPU `i`, as d2l 1.0's `gpu(i)` does; where the lab uses stand-ins, stand-in `i`
    (and the CPU where DPLAB_DEVICES=cpu)."""
    mode = device_mode()
    if mode == "cpu" or using_stand_ins(mode):
        return lab_device(i, mode)
    return torch.device(f"cuda:{i}")


def try_all_gpus() -> list[torch.device]:
    """Return every GPU; with stand-ins, every stand-in; else `[cpu]`."""
    if device_mode() != "cpu" and using_stand_ins():
        return lab_devices(stand_in_count())
    gpus = [torch.device(f"cuda:{i}") for i in range(num_gpus())] if device_mode() != "cpu" else []
    return gpus if gpus else [torch.device("cpu")]


def scatter(tensor: Tensor, devices: list[torch.device]) -> tuple[Tensor, ...]:
    """Split `tensor` along dim 0 as `nn.parallel.scatter` does, on any kind of device.

    `nn.parallel.scatter` itself needs CUDA devices (or the lab's stand-ins); this one also
    takes the CPU and repeated devices. Shard sizes follow `torch.chunk`, so 5 rows over 2
    devices give 3 and 2.
    """
    chunks = torch.chunk(tensor, len(devices), dim=0)
    return tuple(chunk.to(device) for chunk, device in zip(chunks, devices, strict=False))


def synchronize(devices: torch.device | list[torch.device] | None = None) -> None:
    """Wait for queued work on the given GPUs (stand-ins wait for the GPU behind them)."""
    if not torch.cuda.is_available():
        return
    if devices is None:
        torch.cuda.synchronize()
        return
    for device in devices if isinstance(devices, list | tuple) else [devices]:
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif sim.is_stand_in(device):
            sim.synchronize()


_real_cuda_synchronize = torch.cuda.synchronize


def _cuda_synchronize(device=None) -> None:
    """torch.cuda.synchronize where the lab's devices may be stand-ins or the CPU."""
    if device is not None and sim.is_stand_in(device):
        sim.synchronize()
    elif torch.cuda.is_available():
        _real_cuda_synchronize(device)


_REAL_SYNCHRONIZE: list = []


def install_cuda_shims() -> None:
    """Let the book's `torch.cuda.synchronize()` run where the lab's devices are not GPUs.

    Switched on the first time the lab hands out stand-ins or the CPU, and left on: see the
    table in the module docstring.
    """
    if torch.cuda.synchronize is not _cuda_synchronize:
        _REAL_SYNCHRONIZE.append(torch.cuda.synchronize)
    torch.cuda.synchronize = _cuda_synchronize


def remove_cuda_shims() -> None:
    """Put back PyTorch's own `torch.cuda.synchronize` (for tests)."""
    if _REAL_SYNCHRONIZE:
        torch.cuda.synchronize = _REAL_SYNCHRONIZE[0]
