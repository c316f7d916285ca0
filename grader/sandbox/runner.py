"""Run an exercise's cases against the student's code and record what happened.

This is the only part of the grader that calls student code. `python -m grader.sandbox.child`
uses it in a separate process; the notebook's `check()` uses it in the kernel itself.
"""

import contextlib
import io
import signal
import threading
import time
import warnings
from collections.abc import Iterable, Iterator

import torch

from grader.api import Case, Check, Context, Raised, Student
from grader.sandbox.transport import pack

MAX_PRINTED = 4000


def unique_cases(checks: Iterable[Check]) -> list[Case]:
    """Return the cases the checks need, each once, in the checks' order."""
    seen: dict[str, Case] = {}
    for c in checks:
        seen.setdefault(c.case.name, c.case)
    return list(seen.values())


class TimeLimit(BaseException):
    """Raised in the student's code when a case has used up its processor time.

    It derives from BaseException so that a student's `except Exception:` does not swallow it.
    """


def processor_seconds() -> float:
    """Return the processor time this process has used, all its threads together."""
    return time.process_time()


# The processor-time limit of the case running now (None: none): the ranks that a case starts
# (grader.ranks) get it too, all of them together.
case_seconds: list[float | None] = [None]


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise TimeLimit in the block once it has used `seconds` of processor time per thread
    (main thread only; None: no limit).

    Processor time, not wall time: a busy machine slows a case down but does not make it
    use more processor time, so a slow machine never stops correct code, while an endless
    loop is stopped whatever else runs. Code that waits without computing (time.sleep) is
    caught by the grader's watch on the child (see grader.grading).
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise TimeLimit(f"it ran past the time limit of {seconds:g} s of processor time per check")

    previous = signal.signal(signal.SIGPROF, stop)
    # Processor time adds up over PyTorch's threads: each of them may use the limit.
    signal.setitimer(signal.ITIMER_PROF, seconds * max(1, torch.get_num_threads()))
    case_seconds[0] = seconds
    try:
        yield
    finally:
        case_seconds[0] = None
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def holding(case: Case, student: Student, held: dict | None) -> contextlib.ExitStack:
    """Return a context in which the names the case holds are the reference's (if given)."""
    stack = contextlib.ExitStack()
    if held is not None:
        stack.enter_context(student.replaced(**{n: held[n] for n in case.holds if n in held}))
    return stack


def run_case(
    case: Case,
    student: Student,
    ctx: Context,
    arguments: dict | None = None,
    limit: float | None = None,
    held: dict | None = None,
) -> dict:
    """Run one case; return its outcome as plain data (value or error, and printed text).

    `arguments` are the case's parameters as computed by the grader (None: compute them
    here); `limit` is the time limit in seconds of processor time; `held` is a namespace of
    the reference solution, whose functions stand in for the names the case holds.
    """
    printed = io.StringIO()
    started, cpu_started = time.perf_counter(), processor_seconds()
    outcome: dict = {"case": case.name, "held": bool(case.holds) and held is not None}
    case_ctx = ctx.for_case(case.name)
    try:
        with (
            contextlib.redirect_stdout(printed),
            contextlib.redirect_stderr(printed),
            warnings.catch_warnings(),
            holding(case, student, held),
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
    outcome["cpu_seconds"] = processor_seconds() - cpu_started
    return outcome


def run_checks(
    checks: list[Check], student: Student, ctx: Context, held: dict | None = None
) -> dict[str, dict]:
    """Run every case the checks need, here and now; return outcomes by case name."""
    return {c.name: run_case(c, student, ctx, held=held) for c in unique_cases(checks)}
