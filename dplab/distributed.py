"""Start a process group on this machine and run a function in every process of it.

`launch(fn, args, nprocs=N)` forks N processes, each of which joins one process group
(`torch.distributed`) and calls `fn(*args)`. It is what `torchrun --nproc-per-node N` does for
a script, made for functions defined in a notebook:

- the backend is NCCL with one GPU per process where there are N GPUs, else gloo on the CPU;
- the processes meet through a `FileStore` in a fresh temporary folder, so no port is chosen
  and two launches never collide; each process also finds `RANK`, `LOCAL_RANK`, `WORLD_SIZE`
  and `LOCAL_WORLD_SIZE` in its environment, as under torchrun;
- each process computes with one CPU thread, as torchrun's processes do by default;
- what each process prints is shown as it comes, behind `[rank r]`; rank 0's plots are
  shown in the notebook once the run ends;
- a process that raises, dies, computes nothing for `idle_timeout` seconds (a deadlock) or
  runs past `timeout` stops the whole group, and the error names the rank and says where each
  rank was. Ranks blocked in torch.distributed's own waits are called deadlocked sooner, once
  no thread of theirs has run or waited to run for QUIET_SECONDS and none runs Python when
  asked to (a rank in `time.sleep` would): on a machine without a GPU, which a rank could
  wait for.

It returns a `Launched`: rank 0's return value as `.result`, every rank's in `.results`,
and what each rank printed in `.outputs`.
"""

import contextlib
import importlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dplab.launched import (  # noqa: F401  (what a launch gives back, and how it fails)
    AUTOGRAD_FORK_HINT,
    GroupNotFormed,
    Launched,
    LaunchError,
    LaunchSkipped,
    RankFailed,
    RanksHung,
    RanksTimedOut,
    _skipping,
    launches_skipped,
)
from dplab.rank import fork_rank, run_rank
from dplab.rank_watch import Group, watch_group
from labtext import _

MAX_PROCESSES = 16


def choose_backend(nprocs: int, backend: str | None = None) -> str:
    """Return "nccl" when `nprocs` GPUs are there for the asking (one per rank), else "gloo"."""
    if backend in ("gloo", "nccl"):
        return backend
    if backend not in (None, "auto"):
        raise ValueError(
            _('backend must be "gloo", "nccl" or "auto", not {backend}').format(
                backend=repr(backend)
            )
        )
    usable = torch.cuda.is_available() and torch.distributed.is_nccl_available()
    return "nccl" if usable and torch.cuda.device_count() >= nprocs else "gloo"


def local_device() -> torch.device:
    """Return this rank's device: GPU `LOCAL_RANK` where the group runs on NCCL, else the CPU
    (gloo). Call it in a process of a group (under launch or torchrun)."""
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def time_allreduce(
    allreduce: Callable[[torch.Tensor], Any], sizes: list[int], repeats: int = 5
) -> list[float]:
    """In every rank of a group: return, for each size in bytes, the seconds one call of
    `allreduce(tensor)` takes on a float32 tensor of that size (the median of `repeats`
    calls, each the slowest rank's time). Every rank gets the same list."""
    device = local_device()
    seconds = []
    for size in sizes:
        tensor = torch.zeros(max(1, size // 4), device=device)  # zeros: sums never overflow
        allreduce(tensor)  # a first call sets up connections and buffers
        times = []
        for _repeat in range(repeats):
            torch.distributed.barrier()
            start = time.perf_counter()
            allreduce(tensor)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            took = torch.tensor([time.perf_counter() - start], device=device)
            torch.distributed.all_reduce(took, op=torch.distributed.ReduceOp.MAX)
            times.append(float(took))
        seconds.append(sorted(times)[len(times) // 2])
    return seconds


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """Return an all-reduce's bus bandwidth in GB/s, as nccl-tests reports it: the data size
    over the time, times 2 (N - 1) / N, the share of the data each rank sends in a ring."""
    return nbytes / seconds / 1e9 * 2 * (world_size - 1) / world_size


def _show_figures(figures: list[bytes]) -> None:
    from dplab.plot import _in_notebook

    if figures and _in_notebook():
        from IPython.display import Image, display

        for png in figures:
            display(Image(data=png, format="png"))


@contextlib.contextmanager
def launch_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="dplab-launch-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_arguments(fn: Callable, args: tuple, nprocs: int, backend: str | None) -> str:
    """Refuse what cannot be launched, saying why; return the backend to use."""
    if _skipping[0]:
        raise LaunchSkipped(getattr(fn, "__name__", "the function"))
    if not callable(fn):
        raise TypeError(
            _("launch needs a function to run in every process, not {fn}").format(fn=repr(fn))
        )
    if not isinstance(nprocs, int) or not 1 <= nprocs <= MAX_PROCESSES:
        raise ValueError(
            _("nprocs must be a whole number from 1 to {most}, not {nprocs}").format(
                most=MAX_PROCESSES, nprocs=repr(nprocs)
            )
        )
    if not isinstance(args, tuple | list):
        raise TypeError(
            _("args must be a tuple of fn's arguments, not {kind}").format(kind=type(args).__name__)
        )
    chosen = choose_backend(nprocs, backend)
    if chosen == "nccl" and torch.cuda.is_initialized():
        raise RuntimeError(
            _(
                "this process has already used CUDA, and forked processes cannot use it after "
                "that: restart the kernel and launch before any CUDA code runs here, or pass "
                'backend="gloo"'
            )
        )
    if torch.distributed.is_initialized():
        raise RuntimeError(_("launch starts its own process group: call it outside of one"))
    # Every torch.optim optimizer imports torch._dynamo (over a second): import it here, once,
    # so that the ranks, forked afresh at each launch, find it already loaded.
    importlib.import_module("torch._dynamo")
    return chosen


def start_group(
    fn: Callable,
    args: tuple,
    kwargs: dict | None,
    nprocs: int,
    backend: str,
    folder: Path,
    store_timeout: float,
    show: bool,
) -> Group:
    """Fork the ranks of one group; return the parent's view of them."""
    sys.stdout.flush()
    sys.stderr.flush()
    pids: list[int] = []
    with warnings.catch_warnings():  # a notebook's kernel has threads; ranks ignore them
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            for rank in range(nprocs):
                pids.append(
                    fork_rank(
                        run_rank, fn, tuple(args), dict(kwargs or {}), rank, nprocs, backend,
                        folder, store_timeout,
                    )
                )  # fmt: skip
        except BaseException:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            raise
    return Group(folder, pids, show)


def read_results(group: Group, backend: str, started: float) -> Launched:
    """Read back what the ranks of a group that ended well left."""
    results = []
    for rank in range(len(group.pids)):
        with open(group.folder / f"rank{rank}.result", "rb") as f:
            results.append(pickle.load(f))
    figures = [p.read_bytes() for p in sorted((group.folder / "rank0-figures").glob("*.png"))]
    outputs = [group.output(r) for r in range(len(group.pids))]
    return Launched(results, outputs, backend, time.monotonic() - started, figures)


def pause(started: float) -> None:
    # Most groups of the checks finish within a fraction of a second: look often then.
    time.sleep(0.005 if time.monotonic() - started < 1.0 else 0.02)


def launch(
    fn: Callable,
    args: tuple = (),
    kwargs: dict | None = None,
    nprocs: int = 2,
    backend: str | None = None,
    timeout: float = 3600.0,
    idle_timeout: float = 60.0,
    cpu_limit: float | None = None,
    show: bool = True,
) -> Launched:
    """Run `fn(*args, **kwargs)` in every process of a new group of `nprocs` on this machine.

    `backend` is "gloo", "nccl" or None (NCCL when there is a GPU per process); `timeout`
    bounds the run in seconds, `idle_timeout` the time all ranks may compute nothing (a
    deadlock), and `cpu_limit` their processor time together. `show` prints each rank's
    output as it comes and shows rank 0's plots. See the module docstring.
    """
    chosen = check_arguments(fn, args, nprocs, backend)
    started = time.monotonic()
    store_timeout = max(2 * idle_timeout, 30.0) if idle_timeout else timeout
    with launch_folder() as folder:
        group = start_group(fn, args, kwargs, nprocs, chosen, folder, store_timeout, show)
        try:
            for _wait in watch_group(group, nprocs, timeout, idle_timeout, cpu_limit):
                pause(started)
        except BaseException:  # Ctrl-C in the notebook stops every rank too
            group.kill()
            raise
        done = read_results(group, chosen, started)
    if show:
        _show_figures(done.figures)
    return done
