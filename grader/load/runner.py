"""Run an exercise's cases against the student's code and record what happened.

With the loader (notebook.py), this is the only part of the grader that calls student code.
`python -m grader.sandbox.child` uses it in a fenced process; the notebook's `check()` uses
it in the kernel itself (feedback, not a grade).
"""

import contextlib
import io
import time
import warnings
from collections.abc import Iterable

from dplab import sim
from dplab.sim.gpus import answering_as_gpus
from grader.api import Case, Check, Context, Raised, Student
from grader.base.printed import captured
from grader.base.protocol import CaseOutcome
from grader.base.time_limit import TimeLimit, own_processor_seconds, time_limit
from grader.base.values import pack
from grader.manifest import load_manifest

MAX_PRINTED = 4000


def unique_cases(checks: Iterable[Check]) -> list[Case]:
    """Return the cases the checks need, each once, in the checks' order."""
    seen: dict[str, Case] = {}
    for c in checks:
        seen.setdefault(c.case.name, c.case)
    return list(seen.values())


def holding(case: Case, student: Student, held: dict | None) -> contextlib.ExitStack:
    """Return a context in which the names the case holds are the reference's (if given)."""
    stack = contextlib.ExitStack()
    if held is not None:
        stack.enter_context(student.replaced(**{n: held[n] for n in case.holds if n in held}))
    return stack


def as_gpus(case: Case, ctx: Context) -> contextlib.AbstractContextManager:
    """Return a context in which torch.cuda answers for the case's devices, as a server with
    that many GPUs would (dplab.sim.gpus), where they are stand-ins: in the notebooks whose
    exercises train on the devices, not those whose ranks compute on the CPU."""
    parts = case.origin[0].split(".")
    if not ctx.devices or not all(sim.is_stand_in(d) for d in ctx.devices) or len(parts) < 3:
        return contextlib.nullcontext()
    manifest = load_manifest()
    notebook = next((ex.notebook for ex in manifest.exercises if ex.id == parts[2]), None)
    ranks = any(ex.distributed for ex in manifest.exercises if ex.notebook == notebook)
    return answering_as_gpus() if notebook and not ranks else contextlib.nullcontext()


def run_case(
    case: Case,
    student: Student,
    ctx: Context,
    arguments: dict | None = None,
    limit: float | None = None,
    held: dict | None = None,
) -> CaseOutcome:
    """Run one case; return its outcome (value or error, and printed text).

    `arguments` are the case's parameters as computed by the grader (None: compute them
    here); `limit` is the time limit in seconds of processor time; `held` is a namespace of
    the reference solution, whose functions stand in for the names the case holds.
    """
    printed = io.StringIO()
    started, cpu_started = time.perf_counter(), own_processor_seconds()
    value, error = None, None
    case_ctx = ctx.for_case(case.name)
    try:
        with (
            captured(printed),
            warnings.catch_warnings(),
            holding(case, student, held),
            time_limit(limit),
            as_gpus(case, ctx),
        ):
            warnings.simplefilter("ignore")
            args = case.arguments(case_ctx) if arguments is None else arguments
            value = pack(case.run(student, case_ctx, **args))
    except (Exception, SystemExit, TimeLimit) as raised:
        error = Raised.from_exception(raised)
    return CaseOutcome(
        case=case.name,
        held=bool(case.holds) and held is not None,
        value=value,
        error=error,
        printed=printed.getvalue()[-MAX_PRINTED:],
        seconds=time.perf_counter() - started,
        cpu_seconds=own_processor_seconds() - cpu_started,
    )


def run_checks(
    checks: list[Check], student: Student, ctx: Context, held: dict | None = None
) -> dict[str, CaseOutcome]:
    """Run every case the checks need, here and now; return outcomes by case name."""
    return {c.name: run_case(c, student, ctx, held=held) for c in unique_cases(checks)}
