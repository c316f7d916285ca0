"""Grade one submission: find its notebooks, run its cases in a fenced child, judge, report.

    find_submission -> plan -> run_isolated -> time_against_the_reference -> judge
        -> SubmissionResult

Student code runs only in the child (see grader.child and grader.fence). This process sends
it the cases and their inputs, reads back plain data, and decides every verdict. When the
child dies or runs out of time, the exercise it was on gets zero with the reason, and a new
child carries on with the next exercise.

Limits stop loops, not slow correct code:
- a case may use `check_seconds` of *processor* time (per thread), which a busy machine does
  not inflate; the child stops it with TimeLimit, and this process kills a child that
  ignores the stop;
- a child that computes nothing for `idle_seconds` while a case runs is waiting (sleep,
  input, a lock) and is stopped;
- wall time is only a backstop, per exercise (`exercise_seconds`);
- when a case is stopped for processor time, the reference solution runs the same case
  (instructor side): if the reference too needs more than a tenth of the limit on this
  machine, the machine is the slow one, and the case runs again with ten times the
  reference's time; otherwise the message gives both times.
"""

import hashlib
import io
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from dplab.devices import grading_devices, grading_mode
from grader.api import Case, Check, Context
from grader.fence import choose_fence, limit_process, next_child_uid, private_paths
from grader.judge import judge_exercise
from grader.manifest import Exercise, load_manifest, solutions_dir
from grader.reference import available, held_sources, reference
from grader.registry import diagnoser, exercise_checks
from grader.report import ExerciseResult, SubmissionResult, submission_result
from grader.runner import unique_cases
from grader.submission import Submission, find_submission

DEVICES = 2  # the exercises train on two devices, like the book
MAX_FRAME = 512 * 2**20


@dataclass(frozen=True)
class Limits:
    """What one grading child may use."""

    check_seconds: float = 60.0  # processor time of one case, per thread (0: no limit)
    exercise_seconds: float = 900.0  # wall time of one exercise, loading included: a backstop
    memory_gib: float = 4.0  # data memory of the child (0: no limit)
    idle_seconds: float = 30.0  # a case that computes nothing for this long is stopped


def submission_seed(sub_id: str, seed: int) -> int:
    """Return the seed of a submission's random inputs, from its id and the run's seed."""
    return int.from_bytes(hashlib.sha256(f"{sub_id}:{seed}".encode()).digest()[:6], "big")


_children: set[subprocess.Popen] = set()
_children_lock = threading.Lock()


def stop_all_children() -> None:
    """Kill every grading child still running (on Ctrl-C)."""
    with _children_lock:
        for proc in list(_children):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


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


class FrameReader:
    """Parse length-prefixed frames from the child, checking the nonce and the order."""

    def __init__(self, nonce: str) -> None:
        self.nonce, self.buffer, self.seq, self.broken = nonce, b"", 0, ""

    def feed(self, data: bytes) -> list[dict]:
        self.buffer += data
        frames = []
        while not self.broken and len(self.buffer) >= 8:
            (size,) = struct.unpack(">Q", self.buffer[:8])
            if size > MAX_FRAME:
                self.broken = "a message from the grading process was too large"
                break
            if len(self.buffer) < 8 + size:
                break
            payload, self.buffer = self.buffer[8 : 8 + size], self.buffer[8 + size :]
            try:
                frame = torch.load(io.BytesIO(payload), weights_only=True)
            except Exception:
                self.broken = "a message from the grading process could not be read"
                break
            if (
                not isinstance(frame, dict)
                or frame.get("nonce") != self.nonce
                or frame.get("seq") != self.seq
            ):
                self.broken = "something wrote into the channel of the grading process"
                break
            self.seq += 1
            frames.append(frame)
        return frames


def _child_environment(scratch: Path, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADER_", "JUPYTER"))}
    env.update(
        MPLBACKEND="Agg",
        DPLAB_OFFLINE="1",
        DPLAB_DEVICES=grading_mode(),  # the same devices for every submission on this machine
        DPLAB_FIGURE_DIR=str(scratch),
        MPLCONFIGDIR=str(scratch / ".matplotlib"),
        HOME=str(scratch),
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS=str(threads),
        TMPDIR=str(scratch / "tmp"),
    )
    return env


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def processor_seconds_of(pid: int) -> float | None:
    """Return the processor time process `pid` has used, all threads, or None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime and stime


def send_reply(fd: int, nonce: str, **fields) -> None:
    """Write one length-prefixed frame on the pipe the child reads replies from."""
    buffer = io.BytesIO()
    torch.save({"nonce": nonce, **fields}, buffer)
    data = buffer.getvalue()
    payload = struct.pack(">Q", len(data)) + data
    try:
        while payload:
            payload = payload[os.write(fd, payload) :]
    except OSError:  # the child has gone (ended or killed): it reads no more replies
        pass


@dataclass
class Watch:
    """What the child is doing, as its frames tell, and how much it has computed."""

    exercise: str = ""  # the exercise it is on ("" between exercises)
    loading: str = ""  # the notebook it is loading
    statement: tuple[int, int] | None = None  # (code cell, line) of the statement running
    case: str = ""  # the case running
    exercise_started: float = 0.0  # wall clock
    case_cpu: float = 0.0  # processor time at the start of the case
    cpu: float = 0.0  # processor time, last reading
    computed_at: float = 0.0  # wall clock of the last reading that had grown

    def culprit(self) -> str:
        """Say what the child was on, as `run_isolated` reads it (see _run_child)."""
        if self.loading and self.statement is not None:
            return f"statement:{self.loading}:{self.statement[0]}:{self.statement[1]}"
        if self.loading:
            return f"notebook:{self.loading}"
        if self.exercise and self.case:
            return f"case:{self.exercise}:{self.case}"
        if self.exercise:
            return f"exercise:{self.exercise}"
        return ""


def held_reply(exercise: str, asked: list[str], plan) -> list[str] | None:
    """Return the reference cells for what the exercise's cases hold, or None if there are
    none to give (no reference here, or a request the plan does not explain)."""
    ex = load_manifest().exercise(exercise)
    allowed = {n for _, case, _ in plan for n in case.holds}
    names = [n for n in asked if n in allowed]
    if not names or not available(ex.notebook):
        return None
    return held_sources(ex.notebook, names)


def _run_child(
    sub: Submission,
    plans: dict[str, list[tuple[str, Case, dict]]],
    seed: int,
    limits: Limits,
    threads: int,
    scratch: Path,
    collected: Collected,
) -> tuple[str, str]:
    """Run one child on `plans`; return what it was on when it stopped early, and why.

    What it was on is `case:EXERCISE:CASE` when a case was running, `exercise:EXERCISE`
    between two cases, `statement:NOTEBOOK:CELL:LINE` while a top-level statement of a
    notebook ran, `notebook:NOTEBOOK` while loading one before any statement, or "" when
    it was between exercises (or done).
    """
    fence = choose_fence()
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    reply_read, reply_write = os.pipe()
    request = {
        "fd": write_fd,
        "reply_fd": reply_read,
        "nonce": nonce,
        "seed": seed,
        "devices": DEVICES,
        "threads": threads,
        "scratch": str(scratch),
        "private": [str(p) for p in private_paths()],
        "check_seconds": limits.check_seconds,
        "skip": collected.skip,
        "notebooks": {name: str(scratch / "submission" / name) for name in sub.notebooks},
        "exercises": [
            [ex, [[name, list(case.origin), args] for name, case, args in plan]]
            for ex, plan in plans.items()
        ],
    }
    request_path = scratch / f"request-{nonce[:8]}.pt"
    torch.save(request, request_path)
    uid = next_child_uid() if fence.own_uid else None
    if uid is not None:  # the scratch folder becomes this child's alone
        for p in [scratch, *scratch.rglob("*")]:
            os.chown(p, uid, uid)
    log = open(scratch / "child.log", "ab")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            *fence.prefix(uid),
            sys.executable,
            "-X",
            "faulthandler",
            "-m",
            "grader.child",
            str(request_path),
        ],
        cwd=scratch,
        env=_child_environment(scratch, threads),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        pass_fds=(write_fd, reply_read),
        start_new_session=True,
    )
    os.close(write_fd)
    os.close(reply_read)
    with _children_lock:
        _children.add(proc)
    try:
        limit_process(proc.pid, limits.memory_gib)
    except (ProcessLookupError, PermissionError):
        pass  # it has already ended, or the system does not allow it
    reader = FrameReader(nonce)
    now = time.monotonic()
    watch = Watch(exercise_started=now, computed_at=now)
    # The child stops a case at the limit itself; this is for a case that ignores the stop.
    hard_cpu = limits.check_seconds * threads * 1.5 + 10 if limits.check_seconds else 0
    reason = ""
    try:
        while True:
            ready, _, _ = select.select([read_fd], [], [], 0.2)
            data = os.read(read_fd, 1 << 20) if ready else b""
            now = time.monotonic()
            for frame in reader.feed(data):
                kind = frame["kind"]
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
                elif kind == "held":
                    asked = [str(n) for n in frame.get("names", [])]
                    cells = None
                    if frame.get("exercise") == watch.exercise and watch.exercise in plans:
                        cells = held_reply(watch.exercise, asked, plans[watch.exercise])
                    send_reply(reply_write, nonce, cells=cells)
                elif kind == "case-start":
                    watch.case, watch.case_cpu = str(frame["case"]), watch.cpu
                    watch.computed_at = now
                elif kind == "case":
                    watch.case = ""
                    collected.outcomes.setdefault(frame["exercise"], {})[frame["case"]] = frame[
                        "outcome"
                    ]
                elif kind == "exercise-done":
                    collected.changed[frame["exercise"]] = list(frame.get("changed", []))
                    if frame.get("unloadable"):
                        collected.stopped[frame["exercise"]] = str(frame["unloadable"])
                    watch.exercise = ""
            if reader.broken:
                reason = reader.broken
                break
            if ready and not data:  # end of file: the child has closed its end
                break
            cpu = processor_seconds_of(proc.pid)
            if cpu is not None:
                if cpu > watch.cpu + 0.01:
                    watch.computed_at = now
                watch.cpu = cpu
            busy = watch.case or watch.loading  # a case, or a statement while loading
            if busy and hard_cpu and cpu is not None and cpu - watch.case_cpu > hard_cpu:
                reason = (
                    f"it used more than {limits.check_seconds:g} s of processor time, the "
                    "time limit per check, and did not stop"
                )
                break
            if busy and limits.idle_seconds and now - watch.computed_at > limits.idle_seconds:
                reason = (
                    f"it computed nothing for {limits.idle_seconds:g} s: it was waiting "
                    "(time.sleep, input(), a lock or a pipe)"
                )
                break
            if limits.exercise_seconds and now - watch.exercise_started > limits.exercise_seconds:
                what = f"loading {watch.loading}" if watch.loading else "this exercise"
                reason = (
                    f"{what} ran past the time limit of {limits.exercise_seconds:g} s of wall time"
                )
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        with _children_lock:
            _children.discard(proc)
        os.close(read_fd)
        os.close(reply_write)
        log.close()
    if not reason and (watch.exercise or watch.loading or code != 0):
        reason = f"the grading process {describe_exit(code)}"
    return watch.culprit(), reason


def run_isolated(
    sub: Submission, checks: dict[str, list[Check]], seed: int, limits: Limits, threads: int
) -> Collected:
    """Run every exercise's cases in fenced children, restarting after a child stops early."""
    collected = Collected()
    todo = [ex for ex in sub.exercises if ex.id in checks and ex.notebook in sub.notebooks]
    base = Context(seed)
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        scratch = Path(tmp)
        (scratch / "submission").mkdir()
        for name, path in sub.notebooks.items():
            shutil.copyfile(path, scratch / "submission" / name)
        scratch.chmod(0o700)
        (scratch / "tmp").mkdir()
        while todo:
            plans = {
                ex.id: [
                    (c.name, c, c.arguments(base.for_case(c.name)))
                    for c in unique_cases(checks[ex.id])
                    if c.name not in collected.outcomes.get(ex.id, {})
                ]
                for ex in todo
            }
            before = sum(map(len, collected.outcomes.values())) + len(collected.changed)
            culprit, reason = _run_child(sub, plans, seed, limits, threads, scratch, collected)
            kind, _, where = culprit.partition(":")
            if kind == "statement":  # skip that statement and load the notebook again
                notebook, cell, line = where.rsplit(":", 2)
                collected.skip.setdefault(notebook, []).append([int(cell), int(line)])
                collected.skip_notes.setdefault(notebook, []).append(
                    f"code cell {cell}, line {line}: skipped, because {reason} while running it"
                )
            elif kind == "notebook":
                for ex in todo:
                    if ex.notebook == where:
                        collected.stopped[ex.id] = f"while loading {ex.notebook}, {reason}"
            elif kind == "case":  # that case gets the reason; the exercise goes on without it
                exercise, case_name = where.split(":", 1)
                collected.outcomes.setdefault(exercise, {})[case_name] = {"stopped": reason}
            elif kind == "exercise" or reason:
                exercise = where or next(ex.id for ex in todo if ex.id not in collected.changed)
                collected.stopped[exercise] = reason
            progress = sum(map(len, collected.outcomes.values())) + len(collected.changed)
            if kind != "statement" and progress == before and not reason:
                stuck = next(ex for ex in todo if ex.id not in collected.changed)
                collected.stopped[stuck.id] = "the grading process ended without a report"
            todo = [
                ex
                for ex in todo
                if ex.id not in collected.changed and ex.id not in collected.stopped
            ]
    return collected


MARGIN = 10  # a case may use this many times the reference's processor time


def stopped_for_processor_time(outcome: dict) -> bool:
    """Return True for a case stopped because it used up its processor time."""
    error = outcome.get("error") or {}
    return error.get("type") == "TimeLimit" or str(outcome.get("stopped", "")).startswith(
        "it used more than"
    )


def time_against_the_reference(
    sub: Submission,
    checks: dict[str, list[Check]],
    collected: Collected,
    seed: int,
    limits: Limits,
    threads: int,
) -> None:
    """For each case stopped for processor time, time the reference solution on the same
    case: on a machine too slow for the reference itself, run the case again with MARGIN
    times the reference's time; otherwise note the reference's time for the message."""
    for ex in sub.exercises:
        for case_name, outcome in list(collected.outcomes.get(ex.id, {}).items()):
            if not stopped_for_processor_time(outcome) or not available(ex.notebook):
                continue
            on_case = [c for c in checks[ex.id] if c.case.name == case_name]
            solutions = solutions_dir() / ex.notebook
            ref = Submission("reference", solutions, {ex.notebook: solutions}, [ex])
            timed = run_isolated(
                ref, {ex.id: on_case}, seed, replace(limits, check_seconds=0), threads
            )
            ref_outcome = timed.outcomes.get(ex.id, {}).get(case_name, {})
            if "cpu_seconds" not in ref_outcome or "error" in ref_outcome:
                continue
            needed = float(ref_outcome["cpu_seconds"])
            if limits.check_seconds * threads < MARGIN * needed:  # the machine is the slow one
                again = run_isolated(
                    sub,
                    {ex.id: on_case},
                    seed,
                    replace(limits, check_seconds=MARGIN * needed / threads),
                    threads,
                )
                outcome = again.outcomes.get(ex.id, {}).get(case_name, outcome)
            if stopped_for_processor_time(outcome):
                outcome = {**outcome, "reference_cpu": needed}
            collected.outcomes[ex.id][case_name] = outcome


def judge_one(
    ex: Exercise,
    checks: list[Check],
    sub: Submission,
    collected: Collected,
    seed: int,
    hidden: bool,
) -> ExerciseResult:
    """Judge one exercise of a submission from what the children reported."""
    outcomes = dict(collected.outcomes.get(ex.id, {}))
    missing = ""
    if ex.notebook not in sub.notebooks:
        missing = f"{ex.notebook} is missing from the submission"
    elif ex.id in collected.stopped:
        missing = collected.stopped[ex.id]
    elif collected.changed.get(ex.id):
        names = ", ".join(collected.changed[ex.id][:4])
        outcomes = {}
        missing = (
            f"the submission changed the grader's own code or torch ({names}), so "
            "this exercise's results cannot be trusted"
        )
    elif ex.id not in collected.outcomes:
        missing = f"{ex.notebook} could not be loaded: " + "; ".join(
            collected.notes.get(ex.notebook, [])
        )
    ctx = Context(seed, grading_devices(DEVICES), reference(ex.notebook) if hidden else None)
    return judge_exercise(ex.id, ex.function, checks, outcomes, ctx, diagnoser(ex), missing=missing)


def default_threads(jobs: int = 1) -> int:
    """Return how many CPU threads each child should use when `jobs` run side by side."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def grade_submission(
    sub: Submission,
    seed: int = 0,
    hidden: bool = True,
    limits: Limits = Limits(),
    threads: int | None = None,
) -> SubmissionResult:
    """Grade one submission end to end and return its result."""
    sub_seed = submission_seed(sub.id, seed)
    checks = {ex.id: exercise_checks(ex, include_hidden=hidden) for ex in sub.exercises}
    threads = threads or default_threads()
    collected = run_isolated(sub, checks, sub_seed, limits, threads)
    if hidden:  # the instructor's side, where the reference solutions are
        time_against_the_reference(sub, checks, collected, sub_seed, limits, threads)
    results = [
        judge_one(ex, checks[ex.id], sub, collected, sub_seed, hidden) for ex in sub.exercises
    ]
    notes = list(sub.notes)
    for name in sorted(set(collected.notes) | set(collected.skip_notes)):
        items = collected.skip_notes.get(name, []) + collected.notes.get(name, [])
        notes += [f"{name}: {item}" for item in items]
    return submission_result(sub.id, str(sub.path), results, notes)


def select_exercises(sub: Submission, exercises: list[str] | None) -> Submission:
    """Keep only the given exercise ids (all when None)."""
    if exercises:
        manifest = load_manifest()
        wanted = [manifest.exercise(e) for e in exercises]
        sub.exercises = wanted
    return sub


def grade_path(path: str | Path, exercises: list[str] | None = None, **options) -> SubmissionResult:
    """Find the submission at `path`, keep only `exercises` (ids) if given, and grade it."""
    sub = select_exercises(find_submission(path, load_manifest()), exercises)
    return grade_submission(sub, **options)
