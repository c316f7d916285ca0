"""What a forked rank does: join a new process group, call the function, and leave its result
(or its error) where the parent reads it."""

import contextlib
import faulthandler
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from dplab.launched import GroupNotFormed
from dplab.processes import end_with_parent

# ---- inside a rank -------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Return `value` with every tensor on the CPU, so the parent never touches a GPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _quiet_notebook_parts() -> None:
    """Keep a forked rank away from the notebook's connection: plots go to files."""
    from dplab import plot

    plot.HEADLESS = True
    pyplot = sys.modules.get("matplotlib.pyplot")
    # A pyplot that loads when first used (the grader's loader gives one), not used yet,
    # needs no switch: switching would load it, in every rank.
    if pyplot is not None and type(pyplot).__name__ != "_LazyModule":
        pyplot.switch_backend("Agg")


def _log_to_folder(folder: Path, rank: int) -> None:
    """Send what the rank prints, and a crash's stack, to its own log in `folder`."""
    log = os.open(folder / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    if faulthandler.is_enabled():  # a crash's stack goes to this rank's log, not the parent's
        faulthandler.enable(file=sys.stderr, all_threads=False)


def _answer_parent(folder: Path, rank: int) -> None:
    """Let the parent ask the rank, by signals, where it is (SIGUSR1) and whether it runs
    Python (SIGUSR2); leave Ctrl-C to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # faulthandler keeps the file (and so its descriptor) open until the process exits.
    stacks = open(folder / f"rank{rank}.stack", "w")  # noqa: SIM115  (open until exit)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=False)
    # A rank that runs Python when asked (sleeping in time.sleep, say) is not blocked in
    # torch.distributed: the parent asks before it calls a quiet group deadlocked early.
    awake = str(folder / f"rank{rank}.awake")
    signal.signal(signal.SIGUSR2, lambda *_: os.close(os.open(awake, os.O_CREAT, 0o600)))


def _settle_in(folder: Path, rank: int, world: int) -> None:
    """Set the environment a rank's code expects: its rank and world, one thread, and a
    folder of its own for figures."""
    figures = folder / f"rank{rank}-figures"
    figures.mkdir()
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
        DPLAB_FIGURE_DIR=str(figures),
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this machine
    torch.set_num_threads(1)
    _quiet_notebook_parts()


def _join_group(
    rank: int, world: int, backend: str, folder: Path, init_timeout: float
) -> "torch.distributed.Store":
    """Join the new process group that meets in `folder`; return the store it meets by."""
    if backend == "nccl":  # more ranks than GPUs: they share them in turn (NCCL may refuse)
        torch.cuda.set_device(rank % torch.cuda.device_count())
    store = torch.distributed.FileStore(str(folder / "store"), world)
    try:
        torch.distributed.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=init_timeout),
        )
    except Exception as error:
        raise GroupNotFormed(str(error)) from error
    return store


def _leave_result(folder: Path, rank: int, result: Any) -> None:
    """Leave fn's result where the parent reads it, whole or not at all."""
    with open(folder / f"rank{rank}.partial", "wb") as f:
        pickle.dump(_plain(result), f)
    os.replace(folder / f"rank{rank}.partial", folder / f"rank{rank}.result")  # whole


def one_run(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    rank: int,
    world: int,
    backend: str,
    folder: Path,
    init_timeout: float,
) -> int:
    """In a rank: join a new group that meets in `folder`, call fn and leave its result (or
    its error) there, then wait for every rank to finish. Return 0, or 1 if fn raised."""
    try:
        _log_to_folder(folder, rank)
        _answer_parent(folder, rank)
        _settle_in(folder, rank, world)
        store = _join_group(rank, world, backend, folder, init_timeout)
        # fn is called, and the ranks wait for each other, here and not in a helper: the
        # parent cuts a rank's stack at this function (rank_watch.where_from).
        result = fn(*args, **kwargs)
        _leave_result(folder, rank, result)
        # No rank leaves before all have finished: one that left early would close its
        # connections under the others (still connecting, or sending to it). A rank that
        # skipped a call the others make waits here, and the parent says so.
        store.set(f"finished/{rank}", "1")
        store.wait([f"finished/{r}" for r in range(world)])
        return 0
    except BaseException as error:  # the parent reports it, naming this rank
        leave_error(folder, rank, error)
        return 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()


def leave_error(folder: Path, rank: int, error: BaseException) -> None:
    """Leave the error a rank met where the parent looks for it."""
    trace = traceback.format_exc()
    try:
        with open(folder / f"rank{rank}.error", "wb") as f:
            pickle.dump((type(error).__name__, str(error), trace), f)
    except Exception:
        print(trace, file=sys.__stderr__)


def run_rank(*arguments: Any) -> None:
    """Body of a forked rank: one run (see `one_run`), then the process ends."""
    code = 1
    try:
        code = one_run(*arguments)
    finally:
        os._exit(code)  # the group ends with the process (tearing it down costs 30 ms)


def fork_rank(body: Callable[..., None], *arguments: Any) -> int:
    """Fork one rank, which runs `body(*arguments)` (`run_rank` for a launch) and ends with it;
    return its process id. The grading fence lets this function, and no other, start the
    processes of a group (grader.sandbox.fence). A rank ends with the process that forked it,
    even one killed by `kill -9`."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            end_with_parent(parent)
            body(*arguments)
        finally:
            os._exit(1)  # a body ends its process itself: this is for one that returned
    return pid
