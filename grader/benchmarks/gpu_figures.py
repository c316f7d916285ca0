"""The figures of `make gpu-check` (grader.benchmarks.gpu_check): the book's two trainings on
one GPU, what bounds a ResNet-18 epoch, and train_ddp and the all-reduce bench with NCCL.

Each function runs in a child of its own and returns what it measured; nothing here asserts
a speed. Where there is no GPU it runs on the CPU, which is how it is tried out before a
GPU is lent (`--subset 2048 512 --epochs 1`).
"""

import math
import os
import subprocess
import sys
import time
import types

import torch
from torch import nn

from dplab import settings

# Peak arithmetic in TFLOP/s without sparsity, from NVIDIA's data sheets (SXM parts):
# float32 on the CUDA cores, and TensorFloat-32 on the tensor cores, which cuDNN's
# convolutions use by default on these GPUs.
# The book's own figures (its "Multiple GPUs" chapters, on V100s): seconds per epoch.
BOOK_SECONDS = {"lenet": [2.6, 3.0], "resnet18": [12.2, 13.9]}
PEAKS = {"H100": {"fp32": 67.0, "tf32": 494.7}, "H200": {"fp32": 67.0, "tf32": 494.7}}


def figure_device() -> torch.device:
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def recording_d2l(d2l: types.ModuleType, timers: list) -> types.ModuleType:
    """Return a copy of the module `d2l` whose `Timer`s are kept in `timers`, so that the
    reference `train`'s seconds per epoch can be read to the millisecond."""

    class Timer(d2l.Timer):
        def __init__(self) -> None:
            super().__init__()
            timers.append(self)

    copy = types.ModuleType("d2l")
    copy.__dict__.update(vars(d2l))
    copy.Timer = Timer
    return copy


def train_reference(notebook: str, make_args, epochs: int, data, devices) -> dict:
    """Run the reference `train` of `notebook`; return its seconds per epoch and accuracies."""
    import dplab
    from grader.load.reference import reference

    ns = reference(notebook)
    timers: list = []
    ns["d2l"] = recording_d2l(dplab, timers)
    torch.manual_seed(0)
    started = time.perf_counter()
    history = ns["train"](*make_args(ns), num_epochs=epochs, data=data, devices=devices)
    seconds = time.perf_counter() - started
    return {
        "devices": [str(d) for d in devices],
        "seconds_per_epoch": timers[-1].avg(),
        "epoch_seconds": [round(t, 3) for t in timers[-1].times],
        "test_acc": [round(a, 4) for a in history],
        "seconds_in_all": round(seconds, 1),
    }


def data_path_seconds(train_iter, dev: torch.device) -> float:
    """Seconds to cut one epoch's minibatches and copy them to `dev`, with no training."""
    sync(dev)
    started = time.perf_counter()
    for X, y in train_iter:
        X, y = X.to(dev), y.to(dev)
    sync(dev)
    return time.perf_counter() - started


def step_seconds(net: nn.Module, batch: int, steps: int, dev: torch.device) -> float:
    """Seconds for `steps` SGD steps on one minibatch of `batch` random images held on the
    GPU: the arithmetic and its kernel launches, with no data path."""
    opt = torch.optim.SGD(net.parameters(), 0.1)
    loss = nn.CrossEntropyLoss()
    X = torch.rand(batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    for _ in range(3):  # warm-up: cuDNN picks its algorithms
        opt.zero_grad()
        loss(net(X), y).backward()
        opt.step()
    sync(dev)
    started = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss(net(X), y).backward()
        opt.step()
    sync(dev)
    return time.perf_counter() - started


def training_flop(net: nn.Module, batch: int, dev: torch.device) -> int:
    """Floating-point operations of one training step (forward and backward) on `batch`."""
    from torch.utils.flop_counter import FlopCounterMode

    X = torch.rand(batch, 1, 28, 28, device=dev)
    counter = FlopCounterMode(display=False)
    with counter:
        nn.functional.cross_entropy(
            net(X), torch.zeros(batch, dtype=torch.long, device=dev)
        ).backward()
    return counter.get_total_flops()


def resnet_bounds(ns: dict, train_iter, n_train: int, epoch_s: float, dev: torch.device) -> dict:
    """What bounds an epoch of ResNet-18: its arithmetic against the GPU's peak, the data
    path alone, and the same images in larger minibatches (fewer launches per image)."""
    net = ns["resnet18"](10).to(dev)
    flop = training_flop(net, 256, dev) * n_train / 256
    steps = math.ceil(n_train / 256)
    compute = step_seconds(net, 256, steps, dev)
    big = step_seconds(net, 1024, math.ceil(n_train / 1024), dev)
    exact = None
    if dev.type == "cuda":
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        exact = step_seconds(net, 256, max(1, steps // 4), dev) * steps / max(1, steps // 4)
        torch.backends.cudnn.allow_tf32 = before
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = next((p for key, p in PEAKS.items() if key in name), None)
    achieved = flop / epoch_s / 1e12
    return {
        "training_tflop_per_epoch": round(flop / 1e12, 1),
        "achieved_tflops": round(achieved, 2),
        "share_of_fp32_peak": round(achieved / peak["fp32"], 3) if peak else None,
        "share_of_tf32_peak": round(achieved / peak["tf32"], 3) if peak else None,
        "epoch_compute_only_s": round(compute, 3),
        "epoch_data_path_only_s": round(data_path_seconds(train_iter, dev), 3),
        "epoch_compute_batch_1024_s": round(big, 3),
        "epoch_compute_without_tf32_s": round(exact, 3) if exact else None,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
    }


def stand_in_epoch(notebook: str, make_args, data) -> dict:
    """One epoch on the lab's stand-in sim:0 backed by the GPU, as a student with one GPU
    trains (exact float32, each operation through the stand-in layer)."""
    import dplab

    return train_reference(notebook, make_args, 1, data, [dplab.try_gpu(0)])


def book_figures(epochs: int, subset: tuple[int, int] | None) -> dict:
    import dplab

    dev = figure_device()
    train_iter, test_iter = dplab.load_data_fashion_mnist(256, subset=subset)
    data = (train_iter, test_iter)
    n_train = len(train_iter.labels)
    lenet_args = lambda ns: (1, 256, 0.2)  # noqa: E731  the book's: train(num_gpus=1, 256, 0.2)
    resnet_args = lambda ns: (ns["resnet18"](10), 1, 256, 0.1)  # noqa: E731
    found = {
        "data": dplab.data.fashion_mnist().source,
        "train_images": n_train,
        "book_seconds_per_epoch": BOOK_SECONDS,
    }
    found["lenet"] = train_reference("from_scratch.ipynb", lenet_args, epochs, data, [dev])
    found["lenet"]["epoch_data_path_only_s"] = round(data_path_seconds(train_iter, dev), 3)
    found["resnet18"] = train_reference("concise.ipynb", resnet_args, epochs, data, [dev])
    from grader.load.reference import reference

    found["resnet18"]["bounds"] = resnet_bounds(
        reference("concise.ipynb"), train_iter, n_train, found["resnet18"]["seconds_per_epoch"], dev
    )
    if dev.type == "cuda":  # last: the stand-ins turn TensorFloat-32 off for the process
        found["lenet_stand_in"] = stand_in_epoch("from_scratch.ipynb", lenet_args, data)
        found["resnet18_stand_in"] = stand_in_epoch("concise.ipynb", resnet_args, data)
    return found


def torchrun(procs: int, extra: list[str], limit: float) -> dict:
    """Train with the reference train_ddp under torchrun; return its exit code and last lines."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs)]
    command += ["--master-port", str(29500 + procs), "-m", "dplab.train_ddp"]
    command += ["--notebook", "solutions/multigpu/distributed.ipynb", *extra]
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as late:
        code, out = 124, str(late.stdout or "") + str(late.stderr or "")
    lines = [line for line in out.splitlines() if line.strip()]
    telling = ("rror", "NCCL", "dplab", "test acc")
    boilerplate = ("File ", "raise ", "traceback", "error_file", "torch.distributed.elastic")
    said = [
        line
        for line in lines
        if any(w in line for w in telling) and not line.lstrip().startswith(boilerplate)
    ]
    return {
        "exit": code,
        "seconds": round(time.monotonic() - started, 1),
        "said": said[:12],
        "tail": lines[-6:],
    }


def ddp_figures(subset: tuple[int, int] | None) -> dict:
    extra = ["--epochs", "3", "--backend", "nccl"]
    extra += ["--subset", *map(str, subset)] if subset else []
    found = {
        "one_process": torchrun(1, extra, 120),
        "two_processes": torchrun(2, extra, 60),
    }
    code_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "grader.benchmarks.bandwidth", "--backends", "nccl"]
    command += ["--procs", "2", "--repeats", "3", "--no-deadlock"]
    command += ["--plot", os.path.join(settings.FIGURE_DIR.get(), "bench.png")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=code_env)
        found["bench_nccl"] = {
            "exit": done.returncode,
            "output": (done.stdout + done.stderr)[-3000:],
        }
    except subprocess.TimeoutExpired as late:
        found["bench_nccl"] = {"exit": 124, "output": str(late.stdout or "")[-3000:]}
    return found
