"""Watch a running grading child: read its frames, know what it is on, measure the processor
time of its process group, and stop it at a limit."""

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grader.base.limits import Limits
from grader.base.protocol import (
    CaseDone,
    CaseStart,
    Claim,
    ExerciseDone,
    ExerciseStart,
    Frame,
    Go,
    Held,
    HeldCells,
    Loading,
    NotebookLoaded,
    Statement,
)
from grader.load.reference import available, held_sources
from grader.manifest import load_manifest
from grader.sandbox.collected import (
    Collected,
    OnCase,
    OnExercise,
    OnNotebook,
    OnStatement,
    Where,
)
from grader.sandbox.frames import send_reply
from labtext import _

LOG_LINES = 12  # of a crashed child's log, kept in the reason
PROCESSOR_TIME = "processor time"  # the limit that stopped a child (see `over_a_limit`)


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
        said = {
            "SIGSEGV": _("the grading process crashed with a segmentation fault"),
            "SIGBUS": _("the grading process crashed with a bus error"),
            "SIGABRT": _("the grading process aborted"),
            "SIGKILL": _(
                "the grading process was killed (SIGKILL), most likely for using too much memory"
            ),
            "SIGXFSZ": _("the grading process wrote more output than allowed"),
        }
        return said.get(name) or _("the grading process was killed by {signal}").format(signal=name)
    return _(
        "the grading process exited with code {code} (the code called os._exit or sys.exit, "
        "or crashed)"
    ).format(code=code)


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


def phase_seconds(said: object, now: float, watch: Watch) -> float:
    """Return how long a phase took: from its start frame to its end frame, or, when both came
    in one read (a busy machine), what the child says it took. Only `make bench-grade` reads
    the phases, never a grade, so the child's word is taken, within the child's lifetime."""
    seen = now - watch.phase_started
    if isinstance(said, int | float) and math.isfinite(said):
        seen = max(seen, min(float(said), now - watch.started))
    return max(seen, 0.0)


def follow(
    frame: Frame,
    watch: Watch,
    now: float,
    collected: Collected,
    plans: dict,
    reply_fd: int,
    nonce: str,
    claim: Callable[[str, str], bool] | None = None,
) -> None:
    """Take one frame of the child's report into `watch` and `collected`, and answer the
    frames that ask (Claim, Held)."""
    if not watch.reported:
        watch.reported = True
        collected.phases.add("start-up", now - watch.started)
    match frame:
        case Loading(notebook):
            watch.phase_started, watch.loading = now, notebook
            watch.case_cpu, watch.computed_at = watch.cpu, now
        case Statement(_notebook, cell, line):
            watch.statement = (cell, line)
            watch.case_cpu, watch.computed_at = watch.cpu, now
        case NotebookLoaded(notebook, notes, _failed, seconds):
            collected.phases.add("notebook load", phase_seconds(seconds, now, watch))
            watch.loading, watch.statement = "", None
            collected.notes.setdefault(notebook, list(notes))
        case ExerciseStart(exercise):
            watch.exercise, watch.exercise_started = exercise, now
        case Claim(exercise, case):
            planned = any(name == case for name, _, _ in plans.get(exercise, []))
            send_reply(reply_fd, nonce, Go(planned and (claim is None or claim(exercise, case))))
        case Held(exercise, names):
            cells = None
            if exercise == watch.exercise and watch.exercise in plans:
                cells = held_reply(watch.exercise, names, plans[watch.exercise])
            send_reply(reply_fd, nonce, HeldCells(cells))
        case CaseStart(_exercise, case):
            watch.phase_started, watch.case, watch.case_cpu = now, case, watch.cpu
            watch.computed_at = now
        case CaseDone(exercise, case, outcome):
            collected.phases.add("cases", phase_seconds(outcome.seconds, now, watch))
            watch.case = ""
            collected.outcomes.setdefault(exercise, {})[case] = outcome.as_the_child_ran_it()
        case ExerciseDone(exercise, changed, unloadable):  # (children that shared it: in turn)
            collected.changed[exercise] = sorted({*collected.changed.get(exercise, []), *changed})
            if unloadable:
                collected.stopped[exercise] = unloadable
            watch.exercise = ""


def over_a_limit(
    watch: Watch, cpu: float | None, now: float, limits: Limits, hard_cpu: float
) -> tuple[str, str]:
    """Return (the limit, why) the child must be stopped now, or ("", "") if it may go on; the
    limit is PROCESSOR_TIME, "idle" or "wall time" (`why` is in the reader's language)."""
    busy = watch.case or watch.loading  # a case, or a statement while loading
    if busy and hard_cpu and cpu is not None and cpu - watch.case_cpu > hard_cpu:
        return PROCESSOR_TIME, _(
            "it used more than {seconds} s of processor time, the "
            "time limit per check, and did not stop"
        ).format(seconds=f"{limits.check_seconds:g}")
    if busy and limits.idle_seconds and now - watch.computed_at > limits.idle_seconds:
        return "idle", _(
            "it computed nothing for {seconds} s: it was waiting "
            "(time.sleep, input(), a lock or a pipe)"
        ).format(seconds=f"{limits.idle_seconds:g}")
    if limits.exercise_seconds and now - watch.exercise_started > limits.exercise_seconds:
        seconds = f"{limits.exercise_seconds:g}"
        if watch.loading:
            return "wall time", _(
                "loading {notebook} ran past the time limit of {seconds} s of wall time"
            ).format(notebook=watch.loading, seconds=seconds)
        return "wall time", _(
            "this exercise ran past the time limit of {seconds} s of wall time"
        ).format(seconds=seconds)
    return "", ""
