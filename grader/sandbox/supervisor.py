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

import os
import secrets
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dplab.notebook import NotebookError
from grader.api import Case, Context
from grader.base.grading_devices import DEVICES
from grader.base.limits import Limits
from grader.base.protocol import CaseOutcome, CellRef, ChildRequest, Frame, Note, to_plain
from grader.load.notebook import cell_refs, said_cell
from grader.load.runner import unique_cases
from grader.load.submission import Submission
from grader.manifest import load_manifest
from grader.sandbox.collected import (
    Collected,
    OnCase,
    OnExercise,
    OnNotebook,
    OnStatement,
    Phases,
    Stop,
)
from grader.sandbox.fence import private_paths
from grader.sandbox.frames import FrameReader
from grader.sandbox.scheduler import AtOnce, in_threads
from grader.sandbox.speedups import PLAIN, Loop, Speedups
from grader.sandbox.starting import Child, forget, start_child, track
from grader.sandbox.watching import (
    PROCESSOR_TIME,
    GroupTime,
    Watch,
    describe_exit,
    follow,
    log_tail,
    over_a_limit,
)
from labtext import _, current, default_language


def cell_ref(path: Path | None, number: int) -> CellRef:
    """Return code cell `number` of the notebook at `path` as a student finds it (its grade
    id, or what it defines: see grader.base.protocol.CellRef)."""
    try:
        return cell_refs(path)[number - 1][1] if path else CellRef("code", "", number)
    except (NotebookError, IndexError):
        return CellRef("code", "", number)


@dataclass(frozen=True)
class ChildJob:
    """What one child is to run: the cases of `plans` (by exercise: name, case, arguments)
    on the submission copied to `scratch`, adding what it reports to `collected`."""

    sub: Submission
    plans: dict[str, list[tuple[str, Case, dict]]]
    seed: int
    limits: Limits
    threads: int
    scratch: Path
    collected: Collected
    speedups: Speedups = PLAIN  # what the fast path lends (grader.sandbox.speedups)


def child_request(
    job: ChildJob, nonce: str, report_fd: int, reply_fd: int, asks: bool = False
) -> ChildRequest:
    """Return the request a child reads (grader.sandbox.child) for `job`, with the child's
    ends of its pipes; `asks`: whether it asks before each case."""
    names = job.sub.notebooks
    return ChildRequest(
        nonce=nonce,
        fd=report_fd,
        reply_fd=reply_fd,
        seed=job.seed,
        language=current(),  # of what the child says (grader.sandbox.child)
        terminal=default_language(),  # of its notes to whoever runs the command
        devices=DEVICES,
        threads=job.threads,
        scratch=str(job.scratch),
        private=[str(p) for p in private_paths()],
        limits=job.limits,
        asks=asks,
        skip={name: [list(s) for s in job.collected.skip.get(name, [])] for name in names},
        notebooks={name: str(job.scratch / "submission" / name) for name in names},
        exercises=[
            [ex, [[name, list(case.origin), args] for name, case, args in plan]]
            for ex, plan in job.plans.items()
        ],
    )


def run_child(job: ChildJob, claim: Callable[[str, str], bool] | None = None) -> Stop:
    """Run one child on `job`, adding what it reports to its `collected`; return how it
    ended. Where `claim` is given, the child asks before each case, and `claim(exercise,
    case)` says whether it may run it (no other loop of children has it)."""
    plans, limits, threads, scratch = job.plans, job.limits, job.threads, job.scratch
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    reply_read, reply_write = os.pipe()
    request_path = scratch / f"request-{nonce[:8]}.pt"
    asked = time.monotonic()
    request = child_request(job, nonce, write_fd, reply_read, asks=claim is not None)
    torch.save(to_plain(request), request_path)
    try:
        complete = any(load_manifest().exercise(ex).distributed for ex in plans)
        server = job.speedups.fork_server()
        proc = start_child(
            request_path, scratch, threads, limits, write_fd, reply_read, server, complete
        )
    finally:
        os.close(write_fd)
        os.close(reply_read)
    track(proc)
    reader = FrameReader(nonce)
    group_time = GroupTime(proc.pid)
    now = time.monotonic()
    watch = Watch(exercise_started=now, computed_at=now, started=asked)
    # The child stops a case at the limit itself; this is for a case that ignores the stop.
    hard_cpu = limits.hard_cpu_seconds(threads)

    def take(frame: Frame, now: float) -> None:
        follow(frame, watch, now, job.collected, plans, reply_write, nonce, claim)

    try:
        limit, reason = watch_child(read_fd, reader, group_time, watch, limits, hard_cpu, take)
    finally:
        code = end_child(proc, read_fd, reply_write)
    if not reason and (watch.exercise or watch.loading or code != 0):
        reason = describe_exit(code)
        tail = log_tail(scratch / "child.log")
        if tail:
            reason = _("{reason}; the last lines it wrote:\n{lines}").format(
                reason=reason, lines=tail
            )
    return Stop(watch.where(), reason, limit)


def watch_child(
    read_fd: int,
    reader: FrameReader,
    group_time: GroupTime,
    watch: Watch,
    limits: Limits,
    hard_cpu: float,
    take: Callable[[Frame, float], None],
) -> tuple[str, str]:
    """Read the child's frames (each goes to `take`, with when it came) until it closes its
    end, its frames break or it goes over a limit; return (the limit, why) as `over_a_limit`
    last said them, or with why its frames broke."""
    reason, limit = "", ""
    while True:
        ready, _writable, _failed = select.select([read_fd], [], [], 0.2)
        data = os.read(read_fd, 1 << 20) if ready else b""
        now = time.monotonic()
        for frame in reader.feed(data):
            take(frame, now)
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
        limit, reason = over_a_limit(watch, cpu, now, limits, hard_cpu)
        if reason:
            break
    return limit, reason


def end_child(proc: Child, read_fd: int, reply_write: int) -> int:
    """Kill the child's group if the child still runs, wait for it, close this process's ends
    of its pipes; return its exit code."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    code = proc.wait()
    forget(proc)
    os.close(read_fd)
    os.close(reply_write)
    return code


def holds_in_ranks(exercise, cases: list[Case]) -> bool:
    """Return True when the exercise's `cases` start process groups and hold names right with
    the reference's (a helper loop takes those last: grader.sandbox.fast.sharing.Shares)."""
    return exercise.distributed and any(c.holds for c in cases)


def run_isolated(
    sub: Submission,
    checks: dict[str, list],
    seed: int,
    limits: Limits,
    threads: int,
    phases: Phases | None = None,
    at_once: AtOnce | None = None,
    speedups: Speedups = PLAIN,
) -> Collected:
    """Run every exercise's cases in fenced children, in a loop of children per notebook,
    `at_once.now` notebooks at a time (one where None), each in a scratch folder of its own;
    a child that stops early is followed by another. Where `speedups` lend them, more loops
    and more at a time."""
    collected = Collected(phases=phases or Phases())
    todo = [ex for ex in sub.exercises if ex.id in checks and ex.notebook in sub.notebooks]
    notebooks = list(dict.fromkeys(ex.notebook for ex in todo))
    # A notebook whose cases start process groups takes longest: it starts first, and the
    # others share the cores left beside it.
    notebooks.sort(key=lambda nb: not any(ex.distributed for ex in todo if ex.notebook == nb))
    cases = {ex.id: unique_cases(checks[ex.id]) for ex in todo}
    in_notebook = {nb: [ex for ex in todo if ex.notebook == nb] for nb in notebooks}
    by_notebook = {nb: {ex.id: cases[ex.id] for ex in found} for nb, found in in_notebook.items()}
    last = {
        nb: frozenset(ex.id for ex in found if holds_in_ranks(ex, cases[ex.id]))
        for nb, found in in_notebook.items()
    }
    loops = speedups.loops(by_notebook, last)
    case = {(ex, c.name): c for ex, found in cases.items() for c in found}
    job = LoopJob(sub, case, seed, limits, threads, collected, speedups)

    def run(item: tuple[str, Loop]) -> None:
        run_loop(job, item[1])

    items = [(nb, loops.first(nb, collected)) for nb in notebooks]
    most = 2 * len(notebooks)
    room = speedups.room(at_once or AtOnce(), most)
    for done, _running in in_threads(run, items, room, most, loops.more):
        done.result()
    return collected


@dataclass(frozen=True)
class LoopJob:
    """What a submission's loops of children share: the submission, every case (by exercise
    id and case name), and how they run, adding what the children report to `collected`."""

    sub: Submission
    cases: dict[tuple[str, str], Case]
    seed: int
    limits: Limits
    threads: int
    collected: Collected
    speedups: Speedups


def run_loop(job: LoopJob, loop: Loop) -> None:
    """Run the cases left to `loop` in fenced children, restarting after a child stops early.
    One child at a time per loop: each notebook's exercises start from a process that has run
    no other notebook's code (whose autograd threads, for one, would stop the distributed
    exercises from forking their ranks)."""
    base = Context(job.seed)
    manifest = load_manifest()
    collected = job.collected

    def planned(exercise: str, name: str) -> tuple[str, Case, dict]:
        found = job.cases[exercise, name]
        return name, found, found.arguments(base.for_case(name))

    todo = loop.left(collected)
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        scratch = Path(tmp)
        copy_submission(job.sub, scratch)
        while todo:
            plans = {ex: [planned(ex, name) for name in names] for ex, names in todo}
            exercises = [manifest.exercise(ex) for ex in plans]
            before = collected.progress(exercises)
            child = ChildJob(
                job.sub, plans, job.seed, job.limits, job.threads, scratch, collected, job.speedups
            )
            stop = run_child(child, loop.take if loop.asks else None)
            if not take_stop(stop, job.sub, loop, collected, plans):
                return  # a helper is extra: the first loop runs what it has not taken
            progress = collected.progress(exercises)
            if not isinstance(stop.on, OnStatement) and progress == before and not stop.reason:
                # Nothing ran, and it ended well: stuck, unless other loops took the rest.
                if (first := first_left(loop, collected, plans)) is not None:
                    collected.stopped[first] = _("the grading process ended without a report")
            todo = loop.left(collected)


def copy_submission(sub: Submission, scratch: Path) -> None:
    """Fill a loop's `scratch` folder: the submission's notebooks, and a folder for temporary
    files; only this process's user may enter it."""
    (scratch / "submission").mkdir()
    for name, path in sub.notebooks.items():
        shutil.copyfile(path, scratch / "submission" / name)
    scratch.chmod(0o700)
    (scratch / "tmp").mkdir()


def first_left(loop: Loop, collected: Collected, plans: dict) -> str | None:
    """Return the first exercise of `plans` with cases still left to `loop`."""
    left = dict(loop.left(collected))
    return next((ex for ex in plans if ex in left), None)


def take_stop(stop: Stop, sub: Submission, loop: Loop, collected: Collected, plans: dict) -> bool:
    """Record in `collected` where a child of `loop` stopped and why, so that the next child
    carries on (see the module docstring). Return False when the loop is to end: a helper
    loop whose notebook could not be loaded."""
    match stop.on:
        case OnStatement(notebook, cell, line):  # skip it, and load the notebook again
            collected.skip.setdefault(notebook, []).append([cell, line])
            ref = cell_ref(sub.notebooks.get(notebook), cell)
            said = _("{cell}, line {line}: skipped, because {reason} while running it").format(
                cell=said_cell(ref), line=line, reason=stop.reason
            )
            collected.skip_notes.setdefault(notebook, []).append(Note("skipped", said, ref))
        case OnNotebook(notebook):  # every exercise left to this loop is in it
            for ex, names in loop.left(collected):
                if loop.holds_any(ex, names):
                    collected.stopped[ex] = _("while loading {notebook}, {reason}").format(
                        notebook=notebook, reason=stop.reason
                    )
            if loop.helper:
                return False
        case OnCase(exercise, case):  # the case gets the reason; the exercise goes on
            limit = (
                PROCESSOR_TIME if stop.limit == PROCESSOR_TIME else ""
            )  # (grader.sandbox.retiming)
            stopped = CaseOutcome(case, stopped=stop.reason, limit=limit)
            collected.outcomes.setdefault(exercise, {})[case] = stopped
        case OnExercise(exercise):
            collected.stopped[exercise] = stop.reason
        case None if stop.reason:
            if (first := first_left(loop, collected, plans)) is not None:
                collected.stopped[first] = stop.reason
    return True
