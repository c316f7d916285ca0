"""Run an exercise's cases against the student's code and record what happened.

This is the only part of the grader that calls student code. `python -m grader.child`
uses it in a separate process; the notebook's `check()` uses it in the kernel itself.
"""

import contextlib
import io
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from grader.api import Case, Check, Context, Student
from grader.transport import pack

MAX_PRINTED = 4000
MAX_TRACE = 2000


@dataclass(frozen=True)
class Raised:
    """An exception from the student's code: its type, message and where it happened."""

    type: str
    message: str
    where: str
    trace: str

    @classmethod
    def from_exception(cls, error: BaseException) -> "Raised":
        frames = traceback.extract_tb(error.__traceback__)
        mine = [f for f in frames if "code cell" in f.filename or "<string>" in f.filename]
        where = ""
        if mine:
            last = mine[-1]
            where = f"{last.filename.strip('<>')}, line {last.lineno}, in {last.name}"
        trace = "".join(traceback.format_list(mine)) if mine else ""
        return cls(type(error).__name__, str(error)[:1000], where, trace[-MAX_TRACE:])

    def as_data(self) -> dict:
        return {
            "type": self.type,
            "message": self.message,
            "where": self.where,
            "trace": self.trace,
        }

    @classmethod
    def from_data(cls, data: dict) -> "Raised":
        return cls(*(str(data.get(k, "")) for k in ("type", "message", "where", "trace")))


def unique_cases(checks: Iterable[Check]) -> list[Case]:
    """Return the cases the checks need, each once, in the checks' order."""
    seen: dict[str, Case] = {}
    for c in checks:
        seen.setdefault(c.case.name, c.case)
    return list(seen.values())


class TimeLimit(BaseException):
    """Raised in the student's code when a case runs past its time limit.

    It derives from BaseException so that a student's `except Exception:` does not swallow it.
    """


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise TimeLimit in the block after `seconds` (main thread only; None: no limit)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        raise TimeLimit(f"it ran past the time limit of {seconds:g} s per check")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_case(
    case: Case,
    student: Student,
    ctx: Context,
    arguments: dict | None = None,
    limit: float | None = None,
) -> dict:
    """Run one case; return its outcome as plain data (value or error, and printed text).

    `arguments` are the case's parameters as computed by the grader (None: compute them
    here); `limit` is the time limit in seconds.
    """
    printed = io.StringIO()
    started = time.perf_counter()
    outcome: dict = {"case": case.name}
    case_ctx = ctx.for_case(case.name)
    try:
        with (
            contextlib.redirect_stdout(printed),
            contextlib.redirect_stderr(printed),
            warnings.catch_warnings(),
            time_limit(limit),
        ):
            warnings.simplefilter("ignore")
            args = case.arguments(case_ctx) if arguments is None else arguments
            value = case.run(student, case_ctx, **args)
        outcome["value"] = pack(value)
    except (Exception, SystemExit, TimeLimit) as error:
        outcome["error"] = Raised.from_exception(error).as_data()
    outcome["printed"] = printed.getvalue()[-MAX_PRINTED:]
    outcome["seconds"] = time.perf_counter() - started
    return outcome


def run_checks(checks: list[Check], student: Student, ctx: Context) -> dict[str, dict]:
    """Run every case the checks need, here and now; return outcomes by case name."""
    return {c.name: run_case(c, student, ctx) for c in unique_cases(checks)}
