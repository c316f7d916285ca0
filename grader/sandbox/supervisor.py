"""Start fenced children on a submission, watch them, and restart them after a stop.

`run_isolated` is the one entry: it runs every exercise's cases and returns what the children
reported (`Collected`). Student code runs only in the children (grader.sandbox.child), behind
the fence (grader.sandbox.fence); this process reads their frames and decides nothing about
the student's code beyond where a child stopped and why. Each notebook has children, a
scratch folder and a log of its own, so the notebooks of a submission may run side by side.

Limits stop loops, not slow correct code:
- a case may use `check_seconds` of *processor* time (per thread), which a busy machine does
  not inflate; the child stops it with TimeLimit, and this process kills a child that
  ignores the stop;
- a child that computes nothing for `idle_seconds` while a case runs is waiting (sleep,
  input, a lock) and is stopped;
- wall time is only a backstop, per exercise (`exercise_seconds`).

When a child stops early, `Stop.on` says what it was on, and the next child carries on:
a statement of a notebook is skipped on the next load; a case gets the reason and the
exercise goes on without it; an exercise that stopped between cases gets the reason.
"""

import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from dplab.devices import grading_mode
from grader.api import Case, Context
from grader.load.reference import available, held_sources
from grader.load.submission import Submission
from grader.manifest import load_manifest
from grader.sandbox import forkserver
from grader.sandbox.fence import Fence, choose_fence, limit_process, next_child_uid, private_paths
from grader.sandbox.frames import FrameReader, send_reply
from grader.sandbox.runner import unique_cases

DEVICES = 2  # the exercises train on two devices, like the book
LOG_LINES = 12  # of a crashed child's log, kept in the reason


@dataclass(frozen=True)
class Limits:
    """What one grading child may use."""

    check_seconds: float = 60.0  # processor time of one case, per thread (0: no limit)
    exercise_seconds: float = 900.0  # wall time of one exercise, loading included: a backstop
    memory_gib: float = 4.0  # data memory of the child (0: no limit)
    idle_seconds: float = 30.0  # a case that computes nothing for this long is stopped


class Phases:
    """Wall-clock seconds spent in each phase of grading, added up over children and
    submissions (for `make bench-grade`): starting a child up to its first report, loading
    notebooks, running cases, and judging (in grader.grading)."""

    NAMES = ("start-up", "notebook load", "cases", "judging")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.NAMES, 0.0)
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] += seconds


@dataclass
class Collected:
    """What the children reported for one submission."""

    outcomes: dict[str, dict[str, dict]] = field(
        default_factory=dict
    )  # exercise -> case -> outcome
    stopped: dict[str, str] = field(default_factory=dict)  # exercise -> why it did not finish
    changed: dict[str, list[str]] = field(default_factory=dict)  # exercise -> tampered names
    notes: dict[str, list[str]] = field(default_factory=dict)  # notebook -> loading notes
    skip: dict[str, list[list[int]]] = field(default_factory=dict)  # notebook -> [cell, line]
    skip_notes: dict[str, list[str]] = field(default_factory=dict)  # why they were skipped
    phases: Phases = field(default_factory=Phases)  # where the time went
    helpers: int = 0  # children started to share out a notebook's exercises (see Shares)

    def progress(self, exercises: list) -> int:
        """Return how many cases of `exercises` have an outcome, plus those found tampering."""
        return sum(len(self.outcomes.get(ex.id, {})) + (ex.id in self.changed) for ex in exercises)


class Shares:
    """Which loop of children has taken each case of one notebook's exercises.

    A notebook's cases run one after another in a loop of children (`run_notebook`): a child
    takes (claims) each case just before it runs it. Once every notebook has started, a core
    left free (its notebook done, or the others waiting on deadlocked ranks) goes to a helper:
    another loop on the same notebook, which takes the last case nobody has taken and works
    back from there, while the first loop works forward. Each case runs in the loop that took
    it first, and in that loop only (restarted there after a crash, as without helpers).

    A helper takes the exercises in `last` after the others. Those are exercises whose cases
    hold names right with the reference's in ranks shared by the notebook's cases: their ranks
    stop at the exercise's end (grader.ranks.pools.reference_in_ranks), so a helper that began with
    one would fork its ranks twice, while a loop that ends with it forks them once."""

    def __init__(self, cases: dict[str, list[Case]], last: frozenset[str] = frozenset()) -> None:
        # exercise id -> its case names, both in the notebook's order; and each case by both
        self.cases = {ex: [c.name for c in found] for ex, found in cases.items()}
        self.case = {(ex, c.name): c for ex, found in cases.items() for c in found}
        self.last = last
        self.owner: dict[tuple[str, str], object] = {}  # (exercise, case) -> the loop
        self.lock = threading.Lock()

    def backwards(self, order: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
        """Return a helper's order of the exercises and cases in `order`: from the last case
        back, those of the exercises in `last` after the others."""
        found = [(ex, names[::-1]) for ex, names in reversed(order.items())]
        return sorted(found, key=lambda item: item[0] in self.last)  # (a stable sort)

    def take(self, exercise: str, case: str, loop: object) -> bool:
        """Give a case to `loop` unless another loop has it; return True if it is loop's."""
        with self.lock:
            return self.owner.setdefault((exercise, case), loop) is loop

    def open(self, loop: object, collected: Collected) -> dict[str, list[str]]:
        """Return the cases left to run that are the loop's or nobody's, by exercise (those
        with any), in order; None as `loop`: the cases nobody has taken."""
        with self.lock:
            found = {}
            for exercise, names in self.cases.items():
                if exercise in collected.stopped:
                    continue
                ran = collected.outcomes.get(exercise, {})
                left = [
                    name
                    for name in names
                    if name not in ran and self.owner.get((exercise, name), loop) is loop
                ]
                if left:
                    found[exercise] = left
            return found

    def untaken(self, collected: Collected) -> dict[str, list[str]]:
        """Return the cases nobody has taken, as `open` does; none before the notebook's
        first loop has taken one (a helper would only race it)."""
        return self.open(None, collected) if self.owner else {}

    def helper(self, collected: Collected) -> object | None:
        """Return a new loop that has taken the last case nobody has taken, or None if there
        is none (see `untaken`)."""
        free = self.untaken(collected)
        if not free:
            return None
        exercise, names = self.backwards(free)[0]
        loop = object()
        return loop if self.take(exercise, names[0], loop) else None


# ---- where a child was when it stopped ---------------------------------------------------


@dataclass(frozen=True)
class OnStatement:
    """A top-level statement of a notebook, while loading it."""

    notebook: str
    cell: int
    line: int


@dataclass(frozen=True)
class OnNotebook:
    """Loading a notebook, before its first statement."""

    notebook: str


@dataclass(frozen=True)
class OnCase:
    """A case of an exercise."""

    exercise: str
    case: str


@dataclass(frozen=True)
class OnExercise:
    """An exercise, between two of its cases."""

    exercise: str


Where = OnStatement | OnNotebook | OnCase | OnExercise | None


@dataclass(frozen=True)
class Stop:
    """How a child ended: where it was (None: between exercises, or done) and why ("": it
    ended as it should)."""

    on: Where
    reason: str


# ---- watching a child --------------------------------------------------------------------


@dataclass
class Watch:
    """What the child is doing, as its frames tell, and how much it has computed."""

    exercise: str = ""  # the exercise it is on ("" between exercises)
    loading: str = ""  # the notebook it is loading
    statement: tuple[int, int] | None = None  # (code cell, line) of the statement running
    case: str = ""  # the case running
    exercise_started: float = 0.0  # wall clock
    case_cpu: float = 0.0  # processor time at the start of the case
    started: float = 0.0  # wall clock when the child was asked for
    reported: bool = False  # it has sent its first frame
    phase_started: float = 0.0  # wall clock at the start of a load or a case
    cpu: float = 0.0  # processor time, last reading
    computed_at: float = 0.0  # wall clock of the last reading that had grown

    def where(self) -> Where:
        """Say what the child is on."""
        if self.loading and self.statement is not None:
            return OnStatement(self.loading, *self.statement)
        if self.loading:
            return OnNotebook(self.loading)
        if self.exercise and self.case:
            return OnCase(self.exercise, self.case)
        if self.exercise:
            return OnExercise(self.exercise)
        return None


def describe_exit(code: int) -> str:
    """Say in words how a child process ended."""
    if code < 0:
        name = signal.Signals(-code).name
        return {
            "SIGSEGV": "crashed with a segmentation fault",
            "SIGBUS": "crashed with a bus error",
            "SIGABRT": "aborted",
            "SIGKILL": "was killed (SIGKILL), most likely for using too much memory",
            "SIGXFSZ": "wrote more output than allowed",
        }.get(name, f"was killed by {name}")
    return f"exited with code {code} (the code called os._exit or sys.exit, or crashed)"


def log_tail(log: Path, lines: int = LOG_LINES) -> str:
    """Return what a child's log (its stderr) says about how it ended: its last fatal error
    (faulthandler's report, innermost call first) from the top, else its last lines (a
    Python traceback ends with the error)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [
        line
        for line in text.splitlines()
        if line.strip() and not line.startswith("Extension modules:")
    ]
    starts = [i for i, line in enumerate(kept) if line.startswith("Fatal Python error")]
    if starts and len(kept) - starts[-1] > lines:
        return "\n".join(kept[starts[-1] : starts[-1] + lines])
    return "\n".join(kept[-lines:])


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def processor_seconds_of(pid: int) -> float | None:
    """Return the processor time process `pid` has used, all threads, or None if unknown."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime and stime


class GroupTime:
    """The processor time of a child and of the processes it started (the ranks of a process
    group, which share its process group): what a case's limits count. Who belongs is read
    from /proc once a second; their times at every reading."""

    def __init__(self, leader: int) -> None:
        self.leader = leader
        self.members: dict[int, float] = {}  # pid -> its processor time, as last read
        self.looked = 0.0
        self.ended = 0.0  # the time of members that have gone, as last read

    def _look(self) -> None:
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != self.leader and int(name) not in self.members:
                fields = _stat_fields(name)
                if fields is not None and fields[2] == str(self.leader):  # pgrp
                    self.members[int(name)] = 0.0
        self.looked = time.monotonic()

    def seconds(self) -> float | None:
        """Return the group's processor time so far, or None once the child is gone."""
        own = processor_seconds_of(self.leader)
        if own is None:
            return None
        if time.monotonic() - self.looked > 1.0:
            self._look()
        for pid in list(self.members):
            seconds = processor_seconds_of(pid)
            if seconds is None:  # it has ended: keep the time it had when last read
                self.ended += self.members.pop(pid)
            else:
                self.members[pid] = seconds
        return own + self.ended + sum(self.members.values())


def held_reply(exercise: str, asked: list[str], plan) -> list[str] | None:
    """Return the reference cells for what the exercise's cases hold, or None if there are
    none to give (no reference here, or a request the plan does not explain)."""
    ex = load_manifest().exercise(exercise)
    allowed = {n for _, case, _ in plan for n in case.holds}
    names = [n for n in asked if n in allowed]
    if not names or not available(ex.notebook):
        return None
    return held_sources(ex.notebook, names)


# ---- starting a child --------------------------------------------------------------------


class Child(Protocol):
    """A started child: `subprocess.Popen`, or a child of the fork server."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


_children: set[Child] = set()
_children_lock = threading.Lock()


def stop_all_children() -> None:
    """Kill every grading child still running (on Ctrl-C)."""
    with _children_lock:
        for proc in list(_children):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass


def base_environment() -> dict[str, str]:
    """Return the environment every child shares."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADER_", "JUPYTER"))}
    env.update(
        MPLBACKEND="Agg",
        DPLAB_OFFLINE="1",
        DPLAB_DEVICES=grading_mode(),  # the same devices for every submission on this machine
        DPLAB_DATA_SOURCE="sample",  # the same data on every machine, full set installed or not
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def child_environment(scratch: Path, threads: int) -> dict[str, str]:
    """Return the environment of the child working in `scratch`."""
    env = base_environment()
    env.update(
        DPLAB_FIGURE_DIR=str(scratch),
        MPLCONFIGDIR=str(scratch / ".matplotlib"),
        HOME=str(scratch),
        OMP_NUM_THREADS=str(threads),
        TMPDIR=str(scratch / "tmp"),
    )
    env.setdefault("OMP_WAIT_POLICY", forkserver.WAIT_POLICY)  # see there
    return env


def start_mode() -> str:
    """Return how children start: "fork" (from the warm fork server) or "spawn" (a new
    Python each). `GRADER_START` chooses; by default, fork unless a CUDA device is visible."""
    asked = os.environ.get("GRADER_START", "auto").strip().lower()
    if asked in ("fork", "spawn"):
        return asked
    return "spawn" if torch.cuda.device_count() > 0 else "fork"


def fork_server() -> forkserver.ForkServer | None:
    """Return the fork server, ready; None where children must be started afresh (see
    `start_mode`) or the server cannot fence its children."""
    return forkserver.ready_server() if start_mode() == "fork" else None


def children_fence(server: forkserver.ForkServer | None) -> Fence:
    """Return the fence the children get: the one the fork server chose (no need to probe for
    it here too), else this process's."""
    return choose_fence() if server is None else server.fence


def start_child(
    request: Path,
    scratch: Path,
    threads: int,
    limits: Limits,
    report_fd: int,
    reply_fd: int,
    complete: bool = False,
) -> Child:
    """Start a fenced child on the request file `request`, from the fork server where there
    is one, else as a new Python. A `complete` child (its cases start process groups) starts
    with all the server imports (see forkserver.serve)."""
    server = fork_server()
    fence = children_fence(server)
    uid = next_child_uid() if fence.own_uid else None
    if uid is not None:  # the scratch folder becomes this child's alone
        for p in [scratch, *scratch.rglob("*")]:
            os.chown(p, uid, uid)
    env = child_environment(scratch, threads)
    with open(scratch / "child.log", "ab") as log:
        if server is not None:
            order = {
                "request": str(request),
                "scratch": str(scratch),
                "env": env,
                "uid": uid,
                "fence": asdict(server.fence),
                "private": [str(p) for p in private_paths()],
                "tmp": str(scratch / "tmp"),
                "memory_gib": limits.memory_gib,
                "complete": complete,
            }
            try:
                return server.fork(order, report_fd, reply_fd, log.fileno())
            except OSError:  # the server has gone: start this child afresh
                pass
        proc = subprocess.Popen(
            [
                *fence.prefix(uid, scratch / "tmp", limits.memory_gib),
                sys.executable,
                "-X",
                "faulthandler",
                "-m",
                "grader.sandbox.child",
                str(request),
            ],
            cwd=scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(report_fd, reply_fd),
            start_new_session=True,
        )
    try:
        limit_process(proc.pid, limits.memory_gib)
    except (ProcessLookupError, PermissionError):
        pass  # it has already ended, or the system does not allow it
    return proc


def run_child(
    sub: Submission,
    plans: dict[str, list[tuple[str, Case, dict]]],
    seed: int,
    limits: Limits,
    threads: int,
    scratch: Path,
    collected: Collected,
    claim: Callable[[str, str], bool] = lambda exercise, case: True,
) -> Stop:
    """Run one child on `plans`, adding what it reports to `collected`; return how it ended.
    `claim(exercise, case)` says whether the child may run a case (no other child has it)."""
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    reply_read, reply_write = os.pipe()
    request_path = scratch / f"request-{nonce[:8]}.pt"
    asked = time.monotonic()
    torch.save(
        {
            "fd": write_fd,
            "reply_fd": reply_read,
            "nonce": nonce,
            "seed": seed,
            "devices": DEVICES,
            "threads": threads,
            "scratch": str(scratch),
            "private": [str(p) for p in private_paths()],
            "check_seconds": limits.check_seconds,
            "skip": {name: list(collected.skip.get(name, [])) for name in sub.notebooks},
            "notebooks": {name: str(scratch / "submission" / name) for name in sub.notebooks},
            "exercises": [
                [ex, [[name, list(case.origin), args] for name, case, args in plan]]
                for ex, plan in plans.items()
            ],
        },
        request_path,
    )
    try:
        complete = any(load_manifest().exercise(ex).distributed for ex in plans)
        proc = start_child(request_path, scratch, threads, limits, write_fd, reply_read, complete)
    finally:
        os.close(write_fd)
        os.close(reply_read)
    with _children_lock:
        _children.add(proc)
    reader = FrameReader(nonce)
    group_time = GroupTime(proc.pid)
    now = time.monotonic()
    watch = Watch(exercise_started=now, computed_at=now, started=asked)
    # The child stops a case at the limit itself; this is for a case that ignores the stop.
    hard_cpu = limits.check_seconds * threads * 1.5 + 10 if limits.check_seconds else 0
    reason = ""
    try:
        while True:
            ready, _, _ = select.select([read_fd], [], [], 0.2)
            data = os.read(read_fd, 1 << 20) if ready else b""
            now = time.monotonic()
            for frame in reader.feed(data):
                follow(frame, watch, now, collected, plans, reply_write, nonce, claim)
            if reader.broken:
                reason = reader.broken
                break
            if ready and not data:  # end of file: the child has closed its end
                break
            cpu = group_time.seconds()
            if cpu is not None:
                if cpu > watch.cpu + 0.01:
                    watch.computed_at = now
                watch.cpu = cpu
            reason = over_a_limit(watch, cpu, now, limits, hard_cpu)
            if reason:
                break
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        code = proc.wait()
        with _children_lock:
            _children.discard(proc)
        os.close(read_fd)
        os.close(reply_write)
    if not reason and (watch.exercise or watch.loading or code != 0):
        reason = f"the grading process {describe_exit(code)}"
        tail = log_tail(scratch / "child.log")
        if tail:
            reason += "; the last lines it wrote:\n" + tail
    return Stop(watch.where(), reason)


def phase_seconds(said: object, now: float, watch: Watch) -> float:
    """Return how long a phase took: from its start frame to its end frame, or, when both came
    in one read (a busy machine), what the child says it took. Only `make bench-grade` reads
    the phases, never a grade, so the child's word is taken, within the child's lifetime."""
    seen = now - watch.phase_started
    if isinstance(said, int | float) and math.isfinite(said):
        seen = max(seen, min(float(said), now - watch.started))
    return max(seen, 0.0)


def follow(
    frame: dict,
    watch: Watch,
    now: float,
    collected: Collected,
    plans: dict,
    reply_fd: int,
    nonce: str,
    claim: Callable[[str, str], bool] = lambda exercise, case: True,
) -> None:
    """Take one frame of the child's report into `watch` and `collected`, and answer the
    frames that ask (`claim`, `held`)."""
    kind = frame["kind"]
    if not watch.reported:
        watch.reported = True
        collected.phases.add("start-up", now - watch.started)
    if kind in ("loading", "case-start"):
        watch.phase_started = now
    elif kind == "loaded":
        collected.phases.add("notebook load", phase_seconds(frame.get("seconds"), now, watch))
    elif kind == "case":
        outcome = frame.get("outcome")
        said = outcome.get("seconds") if isinstance(outcome, dict) else None
        collected.phases.add("cases", phase_seconds(said, now, watch))
    if kind == "exercise-start":
        watch.exercise, watch.exercise_started = str(frame["exercise"]), now
    elif kind == "loading":
        watch.loading = str(frame["notebook"])
        watch.case_cpu, watch.computed_at = watch.cpu, now
    elif kind == "statement":
        watch.statement = (int(frame["cell"]), int(frame["line"]))
        watch.case_cpu, watch.computed_at = watch.cpu, now
    elif kind == "loaded":
        watch.loading, watch.statement = "", None
        collected.notes.setdefault(frame["notebook"], list(frame.get("notes", [])))
    elif kind == "claim":
        exercise, case = str(frame.get("exercise")), str(frame.get("case"))
        planned = any(name == case for name, _, _ in plans.get(exercise, []))
        send_reply(reply_fd, nonce, go=planned and claim(exercise, case))
    elif kind == "held":
        asked = [str(n) for n in frame.get("names", [])]
        cells = None
        if frame.get("exercise") == watch.exercise and watch.exercise in plans:
            cells = held_reply(watch.exercise, asked, plans[watch.exercise])
        send_reply(reply_fd, nonce, cells=cells)
    elif kind == "case-start":
        watch.case, watch.case_cpu = str(frame["case"]), watch.cpu
        watch.computed_at = now
    elif kind == "case":
        watch.case = ""
        collected.outcomes.setdefault(frame["exercise"], {})[frame["case"]] = frame["outcome"]
    elif kind == "exercise-done":  # (children that shared the exercise report in turn)
        changed = collected.changed.get(frame["exercise"], [])
        collected.changed[frame["exercise"]] = sorted({*changed, *frame.get("changed", [])})
        if frame.get("unloadable"):
            collected.stopped[frame["exercise"]] = str(frame["unloadable"])
        watch.exercise = ""


def over_a_limit(
    watch: Watch, cpu: float | None, now: float, limits: Limits, hard_cpu: float
) -> str:
    """Return why the child must be stopped now, or "" if it may go on."""
    busy = watch.case or watch.loading  # a case, or a statement while loading
    if busy and hard_cpu and cpu is not None and cpu - watch.case_cpu > hard_cpu:
        return (
            f"it used more than {limits.check_seconds:g} s of processor time, the "
            "time limit per check, and did not stop"
        )
    if busy and limits.idle_seconds and now - watch.computed_at > limits.idle_seconds:
        return (
            f"it computed nothing for {limits.idle_seconds:g} s: it was waiting "
            "(time.sleep, input(), a lock or a pipe)"
        )
    if limits.exercise_seconds and now - watch.exercise_started > limits.exercise_seconds:
        what = f"loading {watch.loading}" if watch.loading else "this exercise"
        return f"{what} ran past the time limit of {limits.exercise_seconds:g} s of wall time"
    return ""


def holds_in_ranks(exercise, cases: list[Case]) -> bool:
    """Return True when the exercise's `cases` start process groups and hold names right with
    the reference's (see Shares)."""
    return exercise.distributed and any(c.holds for c in cases)


def run_isolated(
    sub: Submission,
    checks: dict[str, list],
    seed: int,
    limits: Limits,
    threads: int,
    phases: Phases | None = None,
    side_by_side: int | Callable[[], int] = 1,
) -> Collected:
    """Run every exercise's cases in fenced children, `side_by_side` notebooks' at a time
    (a number, or a function that says it now), each in a scratch folder of its own, and
    one more while the cores sit idle (see SpareCores); a child that stops early is followed
    by another. Once every notebook has started, a core left free goes to a helper (see
    `Shares`)."""
    collected = Collected(phases=phases or Phases())
    todo = [ex for ex in sub.exercises if ex.id in checks and ex.notebook in sub.notebooks]
    notebooks = list(dict.fromkeys(ex.notebook for ex in todo))
    # A notebook whose cases start process groups takes longest: it starts first, and the
    # others share the cores left beside it.
    notebooks.sort(key=lambda nb: not any(ex.distributed for ex in todo if ex.notebook == nb))
    cases = {ex.id: unique_cases(checks[ex.id]) for ex in todo}
    shares = {
        nb: Shares(
            {ex.id: cases[ex.id] for ex in todo if ex.notebook == nb},
            frozenset(
                ex.id for ex in todo if ex.notebook == nb and holds_in_ranks(ex, cases[ex.id])
            ),
        )
        for nb in notebooks
    }

    def run(item: tuple[str, object | None]) -> None:
        notebook, helper = item
        run_notebook(sub, shares[notebook], seed, limits, threads, collected, helper)

    def untaken(notebook: str) -> int:
        return sum(map(len, shares[notebook].untaken(collected).values()))

    def can_help() -> bool:
        return any(untaken(nb) for nb in notebooks)

    def helper() -> tuple[str, object] | None:
        for nb in sorted(notebooks, key=untaken, reverse=True):
            loop = shares[nb].helper(collected)
            if loop is not None:
                collected.helpers += 1
                return nb, loop
        return None

    # More start while the cores sit idle: a notebook whose ranks deadlocked waits for the
    # verdict, computing nothing, and the notebooks after it need not wait with it.
    items = [(nb, None) for nb in notebooks]
    extra = (can_help, helper)
    for done, _ in side_by_side_while_idle(run, items, side_by_side, 2 * len(notebooks), extra):
        done.result()
    return collected


def side_by_side_while_idle(
    fn: Callable[[Any], Any],
    items: list,
    least: int | Callable[[], int],
    most: int,
    extra: tuple[Callable[[], bool], Callable[[], Any]] | None = None,
) -> Iterator[tuple[Future, int]]:
    """Run `fn(item)` for each item in threads of their own, in order: `least` at a time (a
    number, or a function that says it now), and one more while the cores sit idle (see
    SpareCores), up to `most`. Once every item has started, `extra = (wanted, make)` asks for
    more: while `wanted()` and there is room as above, `make()` returns one more item (or
    None). Yield each call's future as it finishes, with how many are still running. Closing
    the iterator (Ctrl-C) starts no more and does not wait for those running: the caller
    stops their children."""
    at_least = least if callable(least) else lambda: least
    most = max(1, at_least(), most)
    spare = spare_cores()
    pool = ThreadPoolExecutor(most)
    waiting, running = deque(items), set()

    def room() -> bool:
        fewest = min(most, max(1, at_least()))
        return len(running) < fewest or (len(running) < most and spare.idle())

    try:
        while waiting or running:
            while waiting and room():
                running.add(pool.submit(fn, waiting.popleft()))
            if not waiting and running and extra is not None and extra[0]() and room():
                item = extra[1]()
                if item is not None:
                    running.add(pool.submit(fn, item))
            timeout = LOOK_SECONDS if waiting or extra is not None else None
            finished, running = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
            for done in finished:
                yield done, len(running)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


SPARE_SHARE = 0.75  # of a core, idle on average since the last look: room for one more
LOOK_SECONDS = 0.5


class SpareCores:
    """How idle this process's cores have been since the last look (/proc/stat). Graders
    start one more notebook's child, or one more submission, while they sit idle, so that
    the cores they were given stay busy while a child only waits (ranks watched for a
    deadlock verdict, say). Other users' work on the same cores counts as busy: a shared
    machine gets no extra load. One is shared by the whole process (see spare_cores)."""

    def __init__(self) -> None:
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self.lines = {f"cpu{c}" for c in cores}
        self.lock = threading.Lock()
        self.last = self.read()

    def read(self) -> tuple[float, float] | None:
        """Return (now, seconds these cores have been idle in all), or None where unknown."""
        try:
            with open("/proc/stat") as f:
                rows = [line.split() for line in f if line.startswith("cpu")]
        except OSError:
            return None
        idle = sum(int(r[4]) + int(r[5]) for r in rows if r[0] in self.lines)  # idle, iowait
        return time.monotonic(), idle / os.sysconf("SC_CLK_TCK")

    def idle(self, share: float = SPARE_SHARE) -> bool:
        """Return True if, since the last look at least LOOK_SECONDS ago, `share` of a core
        was idle on average; such a look starts the count anew (so one more at a time)."""
        with self.lock:
            now = self.read()
            if now is None or self.last is None:
                return False
            if now[0] - self.last[0] < LOOK_SECONDS:
                return False
            spare = (now[1] - self.last[1]) / (now[0] - self.last[0])
            self.last = now
            return spare >= share


_spare: list[SpareCores] = []
_spare_lock = threading.Lock()


def spare_cores() -> SpareCores:
    """Return this process's SpareCores."""
    with _spare_lock:
        if not _spare:
            _spare.append(SpareCores())
        return _spare[0]


def run_notebook(
    sub: Submission,
    shares: Shares,
    seed: int,
    limits: Limits,
    threads: int,
    collected: Collected,
    helper: object | None = None,
) -> None:
    """Run the cases of a notebook's exercises (`shares.cases`) in fenced children,
    restarting after a child stops early. One child at a time per loop: each notebook's
    exercises start from a process that has run no other notebook's code (whose autograd
    threads, for one, would stop the distributed exercises from forking their ranks).
    A `helper` (a loop made by `Shares.helper`) runs from the last case back; without one,
    this is the notebook's first loop, which runs them in order."""
    loop = helper if helper is not None else object()
    base = Context(seed)
    manifest = load_manifest()

    def planned(exercise: str, name: str) -> tuple[str, Case, dict]:
        found = shares.case[exercise, name]
        return name, found, found.arguments(base.for_case(name))

    def first_left(plans: dict) -> str | None:
        """Return the first exercise of `plans` with cases still left to this loop."""
        left = shares.open(loop, collected)
        return next((ex for ex in plans if ex in left), None)

    todo = shares.open(loop, collected)
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        scratch = Path(tmp)
        (scratch / "submission").mkdir()
        for name, path in sub.notebooks.items():
            shutil.copyfile(path, scratch / "submission" / name)
        scratch.chmod(0o700)
        (scratch / "tmp").mkdir()
        while todo:
            order = list(todo.items())
            if helper is not None:  # from the far end
                order = shares.backwards(todo)
            plans = {ex: [planned(ex, name) for name in names] for ex, names in order}
            exercises = [manifest.exercise(ex) for ex in plans]
            before = collected.progress(exercises)
            stop = run_child(
                sub, plans, seed, limits, threads, scratch, collected,
                claim=lambda exercise, case: shares.take(exercise, case, loop),
            )  # fmt: skip
            match stop.on:
                case OnStatement(notebook, cell, line):  # skip it, and load the notebook again
                    collected.skip.setdefault(notebook, []).append([cell, line])
                    collected.skip_notes.setdefault(notebook, []).append(
                        f"code cell {cell}, line {line}: skipped, because {stop.reason} "
                        "while running it"
                    )
                case OnNotebook(notebook):  # every exercise left to this loop is in it
                    for ex, names in shares.open(loop, collected).items():
                        if helper is None or any(shares.owner.get((ex, n)) is loop for n in names):
                            collected.stopped[ex] = f"while loading {notebook}, {stop.reason}"
                    if helper is not None:
                        return  # a helper is extra: the first loop runs what it has not taken
                case OnCase(exercise, case):  # the case gets the reason; the exercise goes on
                    collected.outcomes.setdefault(exercise, {})[case] = {"stopped": stop.reason}
                case OnExercise(exercise):
                    collected.stopped[exercise] = stop.reason
                case None if stop.reason:
                    if (first := first_left(plans)) is not None:
                        collected.stopped[first] = stop.reason
            progress = collected.progress(exercises)
            if not isinstance(stop.on, OnStatement) and progress == before and not stop.reason:
                # Nothing ran, and it ended well: stuck, unless other loops took the rest.
                if (first := first_left(plans)) is not None:
                    collected.stopped[first] = "the grading process ended without a report"
            todo = shares.open(loop, collected)
