"""Inputs and recorders that several exercises' checks share.

Nothing here solves an exercise: the inputs are built from seeds, and the recorders only
note what the student's code did.
"""

import contextlib
import os
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from unittest import mock

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode

import dplab
from dplab import settings
from dplab.data import embedded_sample

# LeNet's loss in the book: per-example cross-entropy, summed by the caller.
lenet_loss = nn.CrossEntropyLoss(reduction="none")


def seeded(seed: int) -> torch.Generator:
    """Return a CPU random generator started from `seed` (a case's `ctx.seed`)."""
    return torch.Generator().manual_seed(seed)


def cycle(devices: list[torch.device], k: int) -> list[torch.device]:
    """Return `k` devices taken round-robin from `devices`."""
    return [devices[i % len(devices)] for i in range(k)]


def sample_images(n: int, start: int = 0, split: str = "train") -> tuple[Tensor, Tensor]:
    """Return `n` images (float, N x 1 x 28 x 28) and labels from the embedded sample.

    The checks always use the sample, so that a verdict never depends on which copy of
    Fashion-MNIST a machine has.
    """
    data = embedded_sample()
    images = data.train_images if split == "train" else data.test_images
    labels = data.train_labels if split == "train" else data.test_labels
    X = images[start : start + n].unsqueeze(1).float().div(255)
    return X, labels[start : start + n].clone()


def random_batch(gen: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
    """Return a random batch of `n` 1x28x28 inputs and labels in 0..9."""
    return torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def sgd_step(params: Iterable[Tensor], lr: float) -> None:
    """Take one step of plain SGD: what torch.optim.SGD(params, lr) does on the CPU with its
    defaults (p -= lr * p.grad). Written out for the judges, which run in the grader's own
    process: building any torch.optim optimizer there would import torch._dynamo (1.2 s)."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


def sgd_update(
    params: list[Tensor],
    lr: float,
    buffers: dict[int, Tensor],
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> None:
    """Take one step of torch.optim.SGD's rule with these settings (its defaults: plain SGD),
    written out as `sgd_step` is. `buffers` keeps each parameter's momentum between steps, by
    position."""
    with torch.no_grad():
        for i, p in enumerate(params):
            if p.grad is None:
                continue
            grad = p.grad.add(p, alpha=weight_decay) if weight_decay else p.grad
            if momentum:
                if i not in buffers:
                    buffers[i] = grad.clone()
                else:
                    buffers[i].mul_(momentum).add_(grad, alpha=1 - dampening)
                grad = grad.add(buffers[i], alpha=momentum) if nesterov else buffers[i]
            p.add_(grad, alpha=-lr)


# What torch.optim.SGD's settings are, and their defaults: RunLog notes them.
SGD_SETTINGS = {"momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}


def state(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").clone() for k, v in net.state_dict().items()}


class RunLog:
    """Notes a rank's training run as it reaches the network and the optimizer, whatever
    loads the data: for each forward pass, the mode, whether gradients were on, the batch
    size and the training examples in it (found by their values: -1 for an input that is no
    example of `X`); for each optimizer step, the optimizer and its settings. Also keeps the
    weights at the first training pass. `close()` stops noting optimizer steps (a hook of all
    of torch.optim)."""

    def __init__(self, net: nn.Module, X: torch.Tensor) -> None:
        self.log: list[dict] = []
        self.first: dict[str, torch.Tensor] = {}
        index = {row.numpy().tobytes(): i for i, row in enumerate(X.to(torch.float32))}

        def note_forward(module, inputs):
            batch = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
            training = bool(module.training) and torch.is_grad_enabled()
            examples = []
            if training and batch is not None:
                rows = batch.detach().to("cpu", torch.float32).contiguous()
                examples = [index.get(row.numpy().tobytes(), -1) for row in rows]
            size = int(len(batch)) if batch is not None else 0
            self.log.append(
                {"event": "forward", "training": training, "size": size, "examples": examples}
            )
            if training and not self.first:
                self.first.update(state(module))

        def note_step(optimizer, args, kwargs):
            group = optimizer.param_groups[0] if optimizer.param_groups else {}
            settings = {k: group.get(k) for k in ("lr", *SGD_SETTINGS, "maximize")}
            settings = {
                k: float(v) if isinstance(v, int | float | torch.Tensor) else v
                for k, v in settings.items()
            }
            self.log.append({"event": "step", "optimizer": type(optimizer).__name__, **settings})

        net.register_forward_pre_hook(note_forward)
        self._step_hook = register_optimizer_step_pre_hook(note_step)

    def close(self) -> None:
        self._step_hook.remove()


def lenet_replicas(seed: int, devices: list[torch.device]) -> list[list[Tensor]]:
    """Return one trainable LeNet parameter list per device, equal in value, built afresh."""
    return [[t.to(d).requires_grad_() for t in dplab.lenet_params(seed=seed)] for d in devices]


def _no_such_gpu(n: int) -> RuntimeError:
    """Return the error CUDA gives for a GPU the machine does not have."""
    said = "no CUDA-capable device is detected" if n == 0 else "invalid device ordinal"
    return RuntimeError(
        f"CUDA error: {said}\nCUDA kernel errors might be asynchronously reported at some "
        "other API call, so the stacktrace below might be incorrect."
    )


class PretendedGpus(TorchFunctionMode):
    """While on, `cuda:i` names one of `n` pretended GPUs: a tensor asked for on `cuda:i`
    (a factory's `device=`, `.to(...)`, `.cuda(i)`) is made on the CPU when i < n, and
    fails as CUDA fails when i >= n. So code that finds GPUs by placing a tensor on each
    (the book's first edition does) finds the pretended ones."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def place(self, device):
        """Return where a tensor asked for on `device` is made, or raise as CUDA would."""
        if isinstance(device, int):  # `.cuda(1)`; a bare int elsewhere means a CUDA index too
            device = torch.device("cuda", device)
        if not isinstance(device, str | torch.device):
            return device
        try:
            named = torch.device(device)
        except RuntimeError:
            return device
        if named.type != "cuda":
            return device
        if self.n == 0 or (named.index or 0) >= self.n:
            raise _no_such_gpu(self.n)
        return torch.device("cpu")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs and kwargs["device"] is not None:
            kwargs["device"] = self.place(kwargs["device"])
        if func is torch.Tensor.cuda:  # .cuda(), .cuda(1), .cuda("cuda:1")
            index = args[1] if len(args) > 1 else kwargs.pop("device", None)
            self.place("cuda" if index is None else index)
            return args[0].to("cpu")
        if func is torch.Tensor.to:
            args = (args[0], *[self.place(a) for a in args[1:]])
        return func(*args, **kwargs)


def _gpu_index(n: int, device=None) -> int:
    """Return the index torch.cuda's probes read from `device` (None: the current GPU)."""
    if device is None:
        index = 0
    elif isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index or 0
    if n == 0:
        raise _no_such_gpu(0)
    return index


# The memory of each pretended GPU, in bytes.
_PRETENDED_MEMORY = 16 * 2**30


def _probes(n: int) -> dict:
    """Return torch.cuda's probes of a machine with `n` GPUs, each failing as CUDA's do for a
    GPU that is not there."""
    return {**_property_probes(n), **_runtime_probes(n)}


def _property_probes(n: int) -> dict:
    """Return torch.cuda's lookups of a GPU's properties on a machine with `n` GPUs."""

    def known(device=None) -> int:  # what torch.cuda's property lookups check
        index = _gpu_index(n, device)
        if not 0 <= index < n:
            raise AssertionError("Invalid device id")
        return index

    def properties(device=None) -> SimpleNamespace:
        known(device)
        return SimpleNamespace(
            name="Pretended GPU",
            total_memory=_PRETENDED_MEMORY,
            major=8,
            minor=0,
            multi_processor_count=108,
        )

    def capability(device=None) -> tuple[int, int]:
        info = properties(device)
        return info.major, info.minor

    return {
        "get_device_name": lambda device=None: properties(device).name,
        "get_device_properties": properties,
        "get_device_capability": capability,
    }


def _runtime_probes(n: int) -> dict:
    """Return torch.cuda's calls into the CUDA runtime (memory, the current GPU) on a machine
    with `n` GPUs."""
    total = _PRETENDED_MEMORY

    def ordinal(device=None) -> int:  # what a call into the CUDA runtime checks
        index = _gpu_index(n, device)
        if not 0 <= index < n:
            raise _no_such_gpu(n)
        return index

    def memory(device=None) -> tuple[int, int]:
        ordinal(device)
        return total - 2**30, total

    def nothing_used(device=None) -> int:
        ordinal(device)
        return 0

    def reach(device=None) -> None:  # set_device, synchronize
        ordinal(device)

    class device:  # torch.cuda.device(i): a context that makes GPU i current
        def __init__(self, index) -> None:
            self.index = -1 if index is None else ordinal(index)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc) -> bool:
            return False

    return {
        "mem_get_info": memory,
        "memory_allocated": nothing_used,
        "memory_reserved": nothing_used,
        "max_memory_allocated": nothing_used,
        "set_device": reach,
        "synchronize": reach,
        "current_device": ordinal,
        "device": device,
    }


@contextlib.contextmanager
def pretend_gpus(n: int) -> Iterator[None]:
    """Make the machine look as if it had `n` GPUs while the block runs: `torch.cuda` reports
    them and answers the usual probes for each (name, properties, memory), a tensor can be
    placed on each (on the CPU, in truth: see PretendedGpus) and on no other, and the lab's
    own helpers (d2l.gpu, d2l.num_gpus, ...) follow the book's rules for them, not the
    stand-ins'."""
    cuda = torch.cuda
    probes = {"device_count": lambda: n, "is_available": lambda: n > 0, **_probes(n)}
    saved = {name: getattr(cuda, name) for name in probes}
    mode = os.environ.get(settings.DEVICES.name)
    for name, probe in probes.items():
        setattr(cuda, name, probe)
    os.environ[settings.DEVICES.name] = "real"
    try:
        with PretendedGpus(n):
            yield
    finally:
        for name, original in saved.items():
            setattr(cuda, name, original)
        if mode is None:
            os.environ.pop(settings.DEVICES.name, None)
        else:
            os.environ[settings.DEVICES.name] = mode


class RecordedBatches:
    """An iterable of fixed batches that notes every pass and every batch handed out."""

    def __init__(self, batches: list[tuple[Tensor, Tensor]], tag: str, log: list) -> None:
        self.batches, self.tag, self.log = batches, tag, log

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        self.log.append(("pass", self.tag))
        yield from self.batches


class FirstBatches:
    """The first `per_pass` batches of each pass over `batches`: an epoch of fixed length."""

    def __init__(self, batches: Iterable, per_pass: int) -> None:
        self.batches, self.per_pass = batches, per_pass

    def __len__(self) -> int:
        return self.per_pass

    def __iter__(self) -> Iterator:
        for number, batch in enumerate(self.batches):
            if number == self.per_pass:
                return
            yield batch


def which_replica(replicas: list[list[Tensor]], params) -> int:
    """Return the number of the replica `params` is (a list of parameters), or -1."""
    try:
        first = params[0]
    except (TypeError, IndexError, KeyError):
        return -1
    for number, replica in enumerate(replicas):
        if params is replica or (replica and first is replica[0]):
            return number
    return -1


def mark_of(params, start: Tensor) -> float | None:
    """Return how far recorded steps moved `params` (its first tensor's mean shift from
    `start`), or None where it is not a list of tensors shaped like `start`."""
    try:
        first = params[0].detach().to("cpu")
    except (TypeError, IndexError, KeyError, AttributeError):
        return None
    if not isinstance(first, Tensor) or first.shape != start.shape:
        return None
    return float((first.double() - start.double()).mean())


def homes(replica) -> list[str]:
    """Return the devices a replica's tensors are on, once each, in order."""
    found: list[str] = []
    for t in replica if isinstance(replica, list | tuple) else []:
        where = str(getattr(t, "device", "none"))
        if where not in found:
            found.append(where)
    return found


class MarkedSteps:
    """A `train_batch` that trains nothing but notes each step into `log`: its batch, the
    replicas it got (numbered in the order first seen), the devices, where each replica
    lives and how far the steps moved the first; it moves every replica it gets by `mark`,
    as a step moves the weights, so that what is evaluated later is known by its values."""

    def __init__(self, log: list, batches: dict, start: Tensor, mark: float) -> None:
        self.log, self.batches, self.start, self.mark = log, batches, start, mark
        self.replicas: list[list] = []

    def number(self, replica) -> int:
        """Return the replica's number, a new one for a list not seen before (-1 for others)."""
        number = which_replica(self.replicas, replica)
        if number < 0 and isinstance(replica, list | tuple):
            self.replicas.append(list(replica))
            number = len(self.replicas) - 1
        return number

    def __call__(self, X, y, device_params, devices, lr) -> None:
        used = [self.number(r) for r in device_params]
        moved: set[int] = set()
        with torch.no_grad():
            for r in device_params:
                for t in r if isinstance(r, list | tuple) else []:
                    if isinstance(t, Tensor) and id(t) not in moved:
                        moved.add(id(t))
                        t.add_(self.mark)
        first = mark_of(device_params[0], self.start) if len(device_params) else None
        where = [homes(r) for r in device_params]
        self.log.append(("step", batch_name(self.batches, X), used, [str(d) for d in devices],
                         where, first))  # fmt: skip


def batch_name(batches: dict[str, list[tuple[Tensor, Tensor]]], X: Tensor) -> str:
    """Return which batch `X` is ("train 2"), by identity, by value or as a contiguous part
    of one (nn.DataParallel hands each GPU a part), or "other"."""
    for tag, items in batches.items():
        for i, (B, _) in enumerate(items):
            if X is B:
                return f"{tag} {i}"
    X = X.detach().to("cpu")
    for tag, items in batches.items():
        for i, (B, _) in enumerate(items):
            if X.shape[1:] != B.shape[1:] or len(X) > len(B):
                continue
            for start in range(len(B) - len(X) + 1):
                if torch.equal(X, B[start : start + len(X)]):
                    return f"{tag} {i}"
    return "other"


@contextlib.contextmanager
def quiet_plots(student, log: list) -> Iterator[None]:
    """Swap the Animator (as d2l.Animator, or under any name the student imported it as) for
    one that only records into `log` while the block runs: drawing and saving a figure
    costs a tenth of a second a point, and no check looks at the picture."""
    quiet = quiet_animator(log)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(dplab, "Animator", quiet))
        if "Animator" in student.namespace:
            stack.enter_context(student.replaced(Animator=quiet))
        yield


def quiet_animator(log: list) -> type:
    """Return an Animator class that never draws and notes each `add` into `log`."""

    class QuietAnimator(dplab.Animator):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.inline = False

        def add(self, x, y) -> None:
            ys = list(y) if isinstance(y, list | tuple) else [y]
            log.append(("plot", x, ys))
            super().add(x, y)

        def _draw(self) -> None:
            pass

    return QuietAnimator
