"""Ranks that stay: the processes of a group serve one order after another, each in a new
process group, so that the cases of a notebook fork their ranks once."""

import contextlib
import os
import pickle
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from dplab.launched import Launched, LaunchError
from dplab.processes import processor_seconds
from dplab.rank import fork_rank, leave_error, one_run
from dplab.rank_watch import Group
from grader.ranks.launching import not_formed, run_groups
from labtext import _

# ---- ranks that stay -----------------------------------------------------------------------


class _Ranks:
    """The processes of one group that stay, and the pipes their orders go down."""

    def __init__(self, pids: list[int], pipes: list[int], readies: list[int], key: object) -> None:
        self.pids, self.pipes, self.readies, self.key = pids, pipes, readies, key
        self.broken = False  # a rank has ended, or was stopped: no more orders
        self.busy = False  # an order was sent, and not every rank has said it is ready since

    def ready(self, timeout: float) -> bool:
        """Return True once every rank has left the last order's group (waiting at most
        `timeout` seconds for them), False if one has not."""
        deadline = time.monotonic() + timeout
        for fd in self.readies if self.busy else []:
            waiting, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not waiting or os.read(fd, 1) != b"r":
                return False
        self.busy = False
        return True

    def alive(self) -> bool:
        if not self.broken:
            for pid in self.pids:
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        self.broken = True
        return not self.broken

    def close(self) -> None:
        for fd in self.pipes + self.readies:
            with contextlib.suppress(OSError):
                os.close(fd)
        for pid in self.pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in self.pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.pids, self.pipes, self.readies, self.broken = [], [], [], True


class _Order(Group):
    """The parent's view of one order carried out by ranks that stay: a rank has ended when
    it has marked the order done, or when its process has died."""

    def __init__(self, folder: Path, ranks: _Ranks) -> None:
        super().__init__(folder, ranks.pids, show=False)
        self.ranks = ranks
        self.cpu_before = [processor_seconds(pid) for pid in ranks.pids]

    def reap(self) -> None:
        for rank, pid in enumerate(self.pids):
            if rank in self.status:
                continue
            if (self.folder / f"rank{rank}.done").exists():
                status = 0
            elif (self.folder / f"rank{rank}.last").exists():
                status = 0
                self.ranks.broken = True
            else:
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done, status = pid, 1 << 8
                if not done:
                    continue
                self.ranks.broken = True
                if status == 0:  # it left without marking the order done
                    status = 1 << 8
            self.status[rank] = status
            self.ended.append(rank)
            self.ended_at[rank] = time.time()

    def cpu(self) -> float:
        """Return the processor time of this order's running ranks (their loader workers
        too), counted from when the order came."""
        return sum(
            max(0.0, sum(processor_seconds(p) for p in self.family(r)) - self.cpu_before[r])
            for r in self.running
        )

    def kill(self) -> None:
        running = self.running
        self.ranks.close()  # the others wait on the killed ones: none of them can go on
        for r in running:
            self.status.setdefault(r, signal.SIGKILL)


class RankPool:
    """Groups whose processes stay for many runs, one group per size: what `launch_each`
    does, without forking afresh for each run.

    Forking a process that has imported torch costs some 30 ms of processor time, and its
    first steps more; a grader that runs many small cases in groups of 2, 3 and 4 processes
    spends most of its time there. A pool forks each size's ranks at its first run and sends
    them every later run. Each run is still a group of its own (a new process group, in a new
    folder), and a run ends as under `launch_each`, with the same errors. Ranks that failed,
    were stopped, or were changed by a run are not used again: the next run forks new ones
    (`still_clean`, called here before a group's ranks are forked, returns what each of them
    calls right after its fork, which returns the test that says so; what the test compares
    with is read once, here, rather than in every rank, where reading it copies the pages the
    rank shares with this process). So are
    ranks forked under another `key` (say, what the forking process held then), and ranks
    that have not left their last run's group within `ready_seconds` when the next run comes.

    Functions and arguments sent to ranks that were already there must pickle: module-level
    functions (or `functools.partial` of them) and plain data. Close the pool when done.
    """

    def __init__(
        self,
        still_clean: Callable[[], Callable[[], Callable[[], bool]]] | None = None,
        ready_seconds: float = 5.0,
    ) -> None:
        self.still_clean = still_clean
        self.ready_seconds = ready_seconds
        self.groups: dict[int, _Ranks] = {}
        self.forks = 0  # ranks forked so far
        self.formed_again: list[int] = []  # the sizes of the runs done again (see run_each)

    def _ranks(self, nprocs: int, backend: str, key: object, store_timeout: float) -> _Ranks:
        ranks = self.groups.get(nprocs)
        # Ranks that have not left their last group within `ready_seconds` are not waited for:
        # new ones are forked (the last run had ended well: the ranks owe nothing to it).
        if ranks is not None and ranks.key == key and ranks.alive():
            if ranks.ready(self.ready_seconds):
                return ranks
        if ranks is not None:
            ranks.close()
        sys.stdout.flush()
        sys.stderr.flush()
        forked = _Ranks([], [], [], key)
        in_rank = self.still_clean() if self.still_clean is not None else None
        try:
            for rank in range(nprocs):
                order_read, order_write = os.pipe()
                ready_read, ready_write = os.pipe()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", DeprecationWarning)
                        pid = fork_rank(
                            serve_rank, order_read, ready_write, rank, nprocs, backend,
                            store_timeout, in_rank,
                        )  # fmt: skip
                finally:
                    os.close(order_read)
                    os.close(ready_write)
                forked.pids.append(pid)
                forked.pipes.append(order_write)
                forked.readies.append(ready_read)
                self.forks += 1
        except BaseException:
            forked.close()
            raise
        self.groups[nprocs] = forked
        return forked

    def _send(self, ranks: _Ranks, folder: Path, fn: Callable) -> _Order:
        order = pickle.dumps((str(folder), fn, (), {}))
        ranks.busy = True
        try:
            for fd in ranks.pipes:
                os.write(fd, len(order).to_bytes(8, "big") + order)
        except OSError:  # a rank has gone since: these ranks are done
            ranks.broken = True
        return _Order(folder, ranks)

    def run_each(
        self,
        calls: list[tuple[Callable, int]],
        key: object = None,
        backend: str | None = None,
        timeout: float = 3600.0,
        idle_timeout: float = 60.0,
        cpu_limit: float | None = None,
        stop_after_failure: bool = False,
    ) -> list[Launched | LaunchError]:
        """As `launch_each`, on this pool's ranks (forked now where there are none for a size,
        or none forked under `key`); each size at most once per call."""
        if len({nprocs for _, nprocs in calls}) < len(calls):
            raise ValueError(_("a pool runs one group of each size at a time"))

        def begin(fn: Callable, nprocs: int, chosen: str, folder: Path, store_timeout: float):
            ranks = self._ranks(nprocs, chosen, (key, chosen), store_timeout)
            return self._send(ranks, folder, fn)

        try:
            limits = (timeout, idle_timeout, cpu_limit, begin, stop_after_failure)
            done = run_groups(calls, backend, *limits)
            # A group that could not form has run nothing: once more, on ranks forked anew
            # (those whose run failed serve no more).
            again = [i for i, d in enumerate(done) if not_formed(d)]
            if again:
                redone = run_groups([calls[i] for i in again], backend, *limits)
                for i, outcome in zip(again, redone, strict=True):
                    done[i] = outcome
                    self.formed_again.append(calls[i][1])
            return done
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop every rank of the pool."""
        for ranks in self.groups.values():
            ranks.close()
        self.groups.clear()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_rank(
    commands: int,
    ready: int,
    rank: int,
    world: int,
    backend: str,
    init_timeout: float,
    still_clean: Callable | None,
) -> None:
    """Body of a rank that stays (see `RankPool`): run each order read from `commands`, each in
    a new group, mark it done, leave the group, and say so on `ready`; never returns. A rank
    whose function raised ends; so does one that the test made by `still_clean()` (the
    function the pool's `still_clean` returned before the fork) finds changed by the run (the
    test returns False: the run stands; it raises: the run fails with its error)."""
    code = 1
    try:
        clean = still_clean() if still_clean is not None else (lambda: True)
        while True:
            order = read_order(commands)
            if order is None:  # the pool has closed
                code = 0
                break
            folder, fn, args, kwargs = Path(order[0]), *order[1:]
            code = one_run(fn, args, kwargs, rank, world, backend, folder, init_timeout)
            if code:
                break
            try:
                reusable = clean()
            except Exception as error:
                leave_error(folder, rank, error)
                code = 1
                break
            # "done", or "last" for a rank that stands down (the next order goes to new ranks)
            (folder / f"rank{rank}.{'done' if reusable else 'last'}").touch()
            if not reusable:
                code = 0
                break
            if torch.distributed.is_initialized():  # after the run: it cannot hold the run up
                torch.distributed.destroy_process_group()
            os.write(ready, b"r")
    finally:
        os._exit(code)


def read_order(fd: int) -> tuple | None:
    """Read one order (a length, then a pickle) from `fd`; None at its end."""
    head = read_exactly(fd, 8)
    if head is None:
        return None
    body = read_exactly(fd, int.from_bytes(head, "big"))
    return None if body is None else pickle.loads(body)


def read_exactly(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data
