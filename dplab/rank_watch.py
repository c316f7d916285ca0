"""The parent's watch over the ranks of a group: what each printed and returned, how it
ended, and whether the group is deadlocked or past its limits."""

import contextlib
import os
import pickle
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dplab.launched import AUTOGRAD_FORK_HINT, LaunchError, RankFailed, RanksHung, RanksTimedOut
from dplab.processes import children_of, describe_status, processor_seconds
from labtext import _

# Files whose frames are the machinery's, not the code being run: a stack shown to the user
# leaves them out (a library that wraps torch.distributed adds its own file here).
LIBRARY_PARTS = [
    f"{os.sep}torch{os.sep}",
    f"{os.sep}multiprocessing{os.sep}",
    *(f"dplab{os.sep}{name}.py" for name in ("distributed", "rank", "rank_watch", "processes")),
]


def where_from(dump: str, keep: int = 3) -> str:
    """Say where a faulthandler stack dump shows a rank: the torch.distributed call it waits
    in, then its own innermost frames (the library's own frames left out)."""
    frames = [line.strip() for line in dump.splitlines() if line.strip().startswith("File ")]
    inside = [i for i, f in enumerate(frames) if f.endswith(" in one_run")]
    frames = frames[: inside[0]] if inside else frames  # what lies under fn is the launcher's
    if not frames:
        return ""
    own = [f for f in frames if not any(part in f for part in LIBRARY_PARTS)][:keep]
    called = _("; from ").join(own) if own else frames[0]
    if f"{os.sep}torch{os.sep}distributed{os.sep}" in frames[0] and " in " in frames[0]:
        return _("waiting in torch.distributed's {call}, called from {frames}").format(
            call=frames[0].rsplit(" in ", 1)[1], frames=called
        )
    return called


def own_frames(trace: str) -> str:
    """Return the frames of a rank's traceback that are the code's own (the launcher's and
    torch's left out), each as its place and its line, without the carets."""
    blocks: list[list[str]] = []
    for line in trace.splitlines():
        if line.startswith("  File "):
            blocks.append([line])
        elif blocks and len(blocks[-1]) == 1 and line.startswith("    ") and line.strip(" ~^"):
            blocks[-1].append(line)  # the frame's source line
    own = [b for b in blocks if not any(part in b[0] for part in LIBRARY_PARTS)]
    return "\n".join(line for block in own for line in block)


class Group:
    """The parent's view of the ranks of one launch."""

    def __init__(self, folder: Path, pids: list[int], show: bool) -> None:
        self.folder, self.pids, self.show = folder, pids, show
        self.status: dict[int, int] = {}  # rank -> wait status, once it has ended
        self.ended: list[int] = []  # ranks in the order they ended
        self.ended_at: dict[int, float] = {}  # when the parent found each one ended
        self.read = [0] * len(pids)  # bytes of each rank's log shown so far
        self.partial = [""] * len(pids)
        self.seen: dict[tuple[int, str], tuple] = {}  # (rank, thread) -> schedstat (see demand)
        self.families: dict[int, list[int]] = {}  # rank's pid -> it and its descendants
        self.family_at = -1.0
        self.demanded, self.demand_at = 0.0, 0.0

    def reap(self) -> None:
        for rank, pid in enumerate(self.pids):
            if rank not in self.status:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.status[rank] = status
                    self.ended.append(rank)
                    self.ended_at[rank] = time.time()

    @property
    def running(self) -> list[int]:
        return [r for r in range(len(self.pids)) if r not in self.status]

    def failed(self) -> list[int]:
        """Return the ranks that ended badly, the cause first: a rank whose peer went away
        (its connection closed) failed because of another, which comes before it; otherwise
        the first to fail (when it wrote its error, or was found dead) comes first."""
        bad = [r for r in self.ended if self.status[r] != 0]

        def order(r: int) -> tuple[bool, float]:
            path = self.folder / f"rank{r}.error"
            try:
                text = path.read_bytes()
                return (any(p in text for p in PEER_GONE), path.stat().st_mtime)
            except OSError:
                return (False, self.ended_at[r])

        return sorted(bad, key=order)

    def finished(self) -> list[int]:
        return sorted(r for r in self.ended if self.status[r] == 0)

    def family(self, rank: int) -> list[int]:
        """Return the rank's process and its descendants (looked up at most twice a second)."""
        now = time.monotonic()
        if now - self.family_at > 0.5:
            self.families = children_of([self.pids[r] for r in self.running])
            self.family_at = now
        pid = self.pids[rank]
        return self.families.get(pid, [pid])

    def cpu(self) -> float:
        """Return the processor time of the running ranks and of their own processes."""
        return sum(processor_seconds(p) for r in self.running for p in self.family(r))

    def output(self, rank: int) -> str:
        try:
            return (self.folder / f"rank{rank}.log").read_text(errors="replace")
        except OSError:
            return ""

    def stream(self) -> None:
        """Print what the ranks wrote since last time, a line at a time, behind [rank r]."""
        if not self.show:
            return
        for rank in range(len(self.pids)):
            text = self.output(rank)
            new, self.read[rank] = text[self.read[rank] :], len(text)
            lines = (self.partial[rank] + new).split("\n")
            self.partial[rank] = lines.pop()
            for line in lines:
                print(f"[rank {rank}] {line}", flush=True)

    def flush(self) -> None:
        self.stream()
        for rank, rest in enumerate(self.partial):
            if rest and self.show:
                print(f"[rank {rank}] {rest}", flush=True)
            self.partial[rank] = ""

    def demand(self) -> float:
        """Return the seconds the running ranks' threads have run or waited to run, added up
        since this group's first call. From the kernel's schedstat: time on a processor and
        time waiting for one (a busy machine keeps ranks waiting: that counts as wanting to
        run). The kernel adds a wait when the thread gets a processor, so a thread found
        runnable that has not run since the last call, kept waiting all along, counts as
        wanting to run since then; so does one held up otherwise (in a disk wait, or
        stopped). Threads count from when they are first seen, the threads of the rank's own
        processes too (DataLoader workers: a rank that waits for its workers, kept from a
        processor on a busy machine, is not deadlocked)."""
        now = time.monotonic()
        since_last, self.demand_at = now - (self.demand_at or now), now
        tasks = []
        for r in self.running:
            for pid in self.family(r):  # a rank's loader workers want to run for it
                with contextlib.suppress(OSError):
                    tasks += [(r, f"/proc/{pid}/task/{t}") for t in os.listdir(f"/proc/{pid}/task")]
        for r, folder in tasks:
            try:
                with open(f"{folder}/schedstat", "rb") as f:
                    on_cpu, queued, runs = f.read().split()[:3]
                with open(f"{folder}/stat", "rb") as f:
                    stat = f.read()
            except (OSError, ValueError):
                continue
            used = (int(on_cpu) + int(queued)) / 1e9
            last_used, last_runs = self.seen.get((r, folder), (0.0, None))
            self.demanded += used - last_used
            self.seen[(r, folder)] = (used, runs)
            state = stat[stat.rindex(b")") + 2 :][:1]
            if state in (b"D", b"T", b"t") or (state == b"R" and runs == last_runs):
                self.demanded += since_last
        return self.demanded

    def ask_awake(self, ranks: list[int]) -> None:
        """Ask `ranks` to run a line of Python (see `answered`)."""
        for r in ranks:
            with contextlib.suppress(OSError):
                os.remove(self.folder / f"rank{r}.awake")
            with contextlib.suppress(OSError):
                os.kill(self.pids[r], signal.SIGUSR2)

    def answered(self, ranks: list[int]) -> bool:
        """Return True if one of `ranks` has run Python since `ask_awake`: a rank blocked in
        a call into torch.distributed's C++ cannot until the call returns."""
        return any((self.folder / f"rank{r}.awake").exists() for r in ranks)

    def where(self) -> dict[int, str]:
        """Ask every running rank for its stack (faulthandler); say where each one is."""
        for r in self.running:
            with contextlib.suppress(OSError):
                os.kill(self.pids[r], signal.SIGUSR1)
        # faulthandler writes from its signal handler, at once: wait until every rank's stack
        # is there and has stopped growing (at most STACK_SECONDS, for a rank that never writes).
        deadline, sizes = time.monotonic() + STACK_SECONDS, None
        while time.monotonic() < deadline:
            time.sleep(0.01)
            now = [self._stack_size(r) for r in self.running]
            if now == sizes and all(now):
                break
            sizes = now
        found = {}
        for r in self.running:
            try:
                found[r] = where_from((self.folder / f"rank{r}.stack").read_text())
            except OSError:
                found[r] = ""
        return found

    def _stack_size(self, rank: int) -> int:
        try:
            return os.stat(self.folder / f"rank{rank}.stack").st_size
        except OSError:
            return 0

    def kill(self) -> None:
        for r in self.running:
            with contextlib.suppress(OSError):
                os.kill(self.pids[r], signal.SIGKILL)
        for r in self.running:
            self.status[r] = os.waitpid(self.pids[r], 0)[1]

    def stop(
        self, error: type[LaunchError], message: str, rank: int | None = None, finished=()
    ) -> LaunchError:
        """Stop the ranks still running; return `error` with what every rank printed, and
        what the `finished` ranks returned."""
        self.kill()
        self.flush()
        outputs = [self.output(r) for r in range(len(self.pids))]
        return error(message, rank, outputs, finished, self.results_of(finished))

    def raised(self, rank: int) -> str | None:
        """Return the name of the exception rank's function raised, if it raised one."""
        try:
            with open(self.folder / f"rank{rank}.error", "rb") as f:
                return pickle.load(f)[0]
        except (OSError, EOFError, pickle.UnpicklingError, IndexError, TypeError):
            return None

    def returned(self, rank: int) -> bool:
        """Return True when rank's function has returned (it waits for the others then)."""
        return (self.folder / f"rank{rank}.result").exists()

    def results_of(self, ranks: list[int]) -> dict[int, Any]:
        """Return what each of `ranks` left as its function's result, where it left one."""
        results = {}
        for r in ranks:
            with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
                with open(self.folder / f"rank{r}.result", "rb") as f:
                    results[r] = pickle.load(f)
        return results

    def error_of(self, rank: int) -> str:
        path = self.folder / f"rank{rank}.error"
        if path.exists():
            with open(path, "rb") as f:
                kind, message, trace = pickle.load(f)
            own = own_frames(trace)
            said = _("rank {rank} raised {kind}: {message}").format(
                rank=rank, kind=kind, message=message
            )
            return said + (f"\n{own}" if own else "")
        lines = self.output(rank).strip().splitlines()
        # A library that aborts says why in a line of its own ("what(): ..."), which the stack
        # that Python's fault handler writes after it would push out of the last lines.
        why = [i for i, line in enumerate(lines) if line.lstrip().startswith("what():")]
        said = "\n".join(lines[max(0, why[-1] - 1) : why[-1] + 1] if why else lines[-6:])
        how = describe_status(self.status[rank])
        if said:
            return _("rank {rank}'s process {how}; the last lines it wrote:\n{lines}").format(
                rank=rank, how=how, lines=said
            )
        return _("rank {rank}'s process {how}").format(rank=rank, how=how)


# What gloo says when the process at the other end of a connection has gone.
PEER_GONE = (b"Connection closed by peer", b"Connection reset by peer", b"Read error")
IDLE_SHARE = 0.05  # ranks that use less than this share of one core are waiting, not computing
# Ranks whose threads want a processor (run, wait for one, or wait on the disk) this share of
# the time or more are slow, not stuck: kept from a processor (a container's CPU quota, a busy
# machine) or reading pages back on a machine short of memory. Waiting ranks want far less,
# though on a busy machine each of their brief wake-ups waits its turn for a processor.
STARVED_SHARE = 0.5
# Ranks whose threads have neither run nor waited for a processor for this long (a busy machine
# keeps them waiting), and that run no Python when asked to, wait inside torch.distributed for
# each other: a deadlock, called before idle_timeout.
QUIET_SECONDS = 0.6
ANSWER_SECONDS = 0.2  # how long a rank has to answer (a Python signal handler runs at once)
DEMAND_SECONDS = 0.1  # how often the parent reads what the waiting ranks' threads are doing
STACK_SECONDS = 0.3  # the longest a deadlocked rank is given to write its stack (see where)


def quiet(
    then: tuple[float, float, float], later: tuple[float, float, float], wanted=IDLE_SHARE
) -> bool:
    """Return True if, between two readings (wall clock, demand, processor time), the ranks
    computed next to nothing and their threads wanted to run less than `wanted` of the time
    (see Group.demand)."""
    seconds = later[0] - then[0]
    return later[2] - then[2] < IDLE_SHARE * seconds and later[1] - then[1] < wanted * seconds


def busy_machine() -> float:
    """Return how many times over the machine's processors are wanted (1 at most load): on
    a machine that busy, ranks wait longer for a processor, and are given longer."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:
        return 1.0


def _accelerator_here() -> bool:
    """Return True if this machine has an NVIDIA or AMD GPU (a rank may wait for one, asleep,
    computing nothing on the processor): then only idle_timeout calls ranks deadlocked."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


class _Stillness:
    """What watch_group remembers between its looks at a group, to tell whether the ranks
    are stuck: idle for idle_timeout seconds, or deadlocked (found early, see `deadlock`).
    Idle means the ranks computed next to nothing and were not starved (STARVED_SHARE)."""

    def __init__(self, group: Group, idle_timeout: float) -> None:
        self.group, self.idle_timeout = group, idle_timeout
        self.early = bool(idle_timeout) and idle_timeout > QUIET_SECONDS and not _accelerator_here()
        # (wall clock, demand, processor time), read every DEMAND_SECONDS: those of the last
        # idle_timeout seconds and of the last QUIET_SECONDS (each with the one before them).
        self.readings: list[tuple[float, float, float]] = []
        self.demands: list[tuple[float, float, float]] = []
        # When the waiting ranks were asked to answer, and the reading they were quiet since.
        self.asked: tuple[float, tuple[float, float, float]] | None = None

    def look(self, now: float, cpu: float) -> None:
        """Take a reading of the ranks, at most every DEMAND_SECONDS."""
        if not self.readings or now - self.readings[-1][0] >= DEMAND_SECONDS:
            reading = (now, self.group.demand(), cpu)
            self.readings.append(reading)
            self.demands.append(reading)
        quiet_span = QUIET_SECONDS * busy_machine()  # a loaded machine stretches every wait
        for kept, span in ((self.readings, self.idle_timeout), (self.demands, quiet_span)):
            while len(kept) > 2 and kept[1][0] <= now - span:
                kept.pop(0)

    def idle(self) -> bool:
        """Return True if the ranks hardly ran or wanted to over the last idle_timeout s."""
        # Waiting ranks are not quite still (a library may wake up now and then): they are
        # stuck when, over the last idle_timeout seconds, they computed next to nothing.
        first, last = self.readings[0], self.readings[-1]
        return bool(self.idle_timeout and last[0] - first[0] >= self.idle_timeout) and quiet(
            first, last, STARVED_SHARE
        )

    def deadlock(self, now: float) -> float | None:
        """Return how many seconds the waiting ranks have been quiet if they are deadlocked,
        found before idle_timeout: their threads hardly wanted to run for QUIET_SECONDS and
        then none of them ran Python when asked to. Otherwise None."""
        if not self.early:
            return None
        group, demands, slow = self.group, self.demands, busy_machine()
        waiting = [r for r in group.running if not group.returned(r)]
        if not waiting:
            self.asked = None
        elif self.asked is None:
            if now - demands[0][0] >= QUIET_SECONDS * slow and quiet(demands[0], demands[-1]):
                group.ask_awake(waiting)
                self.asked = (now, demands[0])
        elif now - self.asked[0] >= ANSWER_SECONDS * slow:
            if group.answered(waiting):
                self.early = False  # it sleeps in Python (time.sleep): idle_timeout decides
            elif quiet(self.asked[1], demands[-1]):
                return now - self.asked[1][0]
            else:
                self.asked = None
        return None


def _hung(group: Group, nprocs: int, quiet_for: float) -> LaunchError:
    """Stop a stuck group; return the RanksHung that says where each waiting rank was."""
    stacks = group.where()
    done = [r for r in range(nprocs) if group.returned(r)]
    waiting = [r for r in range(nprocs) if r not in done]
    seconds = f"{round(quiet_for, 1):g}"
    lines = []
    for r in waiting:
        if stacks.get(r):
            said = _("rank {rank} computed nothing for {seconds} s and had not finished: {where}")
        else:
            said = _("rank {rank} computed nothing for {seconds} s and had not finished")
        lines.append(said.format(rank=r, seconds=seconds, where=stacks.get(r)))
    if done:
        lines.append(
            _("rank(s) {ranks} had returned, and waited for the others to return too").format(
                ranks=", ".join(map(str, done))
            )
        )
    why = (
        _("a rank skipped a call that the others made, so they wait for it.")
        if done
        else _(
            "the ranks are waiting for each other (a deadlock): for example every "
            "rank doing a blocking send first."
        )
    )
    rank = waiting[0] if len(waiting) == 1 else None
    hung = group.stop(RanksHung, why + "\n  " + "\n  ".join(lines), rank, done)
    hung.cause = repr(("hung", [(r, stacks.get(r)) for r in waiting], done))
    return hung


def _failure(group: Group, nprocs: int, failed: list[int]) -> RankFailed:
    """Return the RankFailed for an ended group: the first rank to fail (the cause) and its
    error, the ranks that stopped after it, and those that had finished."""
    first, others = failed[0], sorted(failed[1:] + group.running)
    message = group.error_of(first)
    if "autograd's threading in combination with fork" in message:
        message += "\n" + _(AUTOGRAD_FORK_HINT)
    if others:
        message += "\n" + _("(then rank(s) {ranks} stopped as well)").format(
            ranks=", ".join(map(str, others))
        )
    finished = group.finished()
    if finished:
        message += "\n" + _(
            "(rank(s) {ranks} had finished: a rank that skips a collective or a send leaves "
            "the others waiting for it)"
        ).format(ranks=", ".join(map(str, finished)))
    outputs = [group.output(r) for r in range(nprocs)]
    returned = [r for r in range(nprocs) if group.returned(r)]
    results = group.results_of(returned)
    return RankFailed(message, first, outputs, returned, results, group.raised(first))


def watch_group(
    group: Group, nprocs: int, timeout: float, idle_timeout: float, cpu_limit: float | None
) -> Iterator[None]:
    """Watch the ranks until all have ended well; raise a LaunchError naming who did not.
    A generator: it yields whenever the caller should wait a moment and look again, so that
    one caller can watch several groups at once."""
    started = time.monotonic()
    grace_until = None  # after a rank fails, the others get a moment to fail by themselves
    stillness = _Stillness(group, idle_timeout)
    while True:
        group.reap()
        group.stream()
        now = time.monotonic()
        if not group.running:
            break
        if group.failed() and grace_until is None:
            grace_until = now + 2.0
        if grace_until is not None and now > grace_until:
            break
        cpu = group.cpu()
        stillness.look(now, cpu)
        stuck = stillness.idle()
        quiet_for = idle_timeout
        if not stuck and grace_until is None:
            deadlocked_for = stillness.deadlock(now)
            if deadlocked_for is not None:
                stuck, quiet_for = True, deadlocked_for
        if cpu_limit and cpu > cpu_limit:
            raise group.stop(
                RanksTimedOut,
                _(
                    "the {n} processes used more than {seconds} s of processor time between "
                    "them and were stopped"
                ).format(n=nprocs, seconds=f"{cpu_limit:.3g}"),
            )
        if stuck and grace_until is None and all(group.returned(r) for r in range(nprocs)):
            # Every rank's function has returned, so none waits for the code any more: what
            # is left (the ranks' last wait for each other, then leaving) is the launcher's
            # own, and a machine busy enough can stall it. The results are whole: take them.
            group.kill()
            group.status.update(dict.fromkeys(range(nprocs), 0))
            break
        if stuck and grace_until is None:
            raise _hung(group, nprocs, quiet_for)
        if timeout and now - started > timeout:
            raise group.stop(
                RanksTimedOut,
                _("the {n} processes ran past the limit of {seconds} s and were stopped").format(
                    n=nprocs, seconds=f"{timeout:g}"
                ),
            )
        yield
    if group.running:
        group.kill()
    group.flush()
    failed = group.failed()
    if failed:
        raise _failure(group, nprocs, failed)
