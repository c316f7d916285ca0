"""Run an exercise's cases against the student's code and record what happened.

This is the only part of the grader that calls student code. `python -m grader.child`
uses it in a separate process; the notebook's `check()` uses it in the kernel itself.
"""

import contextlib
import io
import time
import traceback
import warnings
from collections.abc import Iterable
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


def run_case(case: Case, student: Student, ctx: Context) -> dict:
    """Run one case; return its outcome as plain data (value or error, and printed text)."""
    printed = io.StringIO()
    started = time.perf_counter()
    outcome: dict = {"case": case.name}
    try:
        with (
            contextlib.redirect_stdout(printed),
            contextlib.redirect_stderr(printed),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            value = case.run(student, ctx.for_case(case.name))
        outcome["value"] = pack(value)
    except (Exception, SystemExit) as error:
        outcome["error"] = Raised.from_exception(error).as_data()
    outcome["printed"] = printed.getvalue()[-MAX_PRINTED:]
    outcome["seconds"] = time.perf_counter() - started
    return outcome


def run_checks(checks: list[Check], student: Student, ctx: Context) -> dict[str, dict]:
    """Run every case the checks need; return outcomes by case name."""
    return {c.name: run_case(c, student, ctx) for c in unique_cases(checks)}
