"""`check(exercise_id, function)`: run an exercise's checks from a notebook cell.

The checks run right here in the kernel, against the function you just wrote, and print
each check with its hint. The cell's value is the points earned, which is how nbgrader
reads partial credit from an autograded cell.
"""

import os
from collections.abc import Callable

from dplab.devices import lab_devices
from grader.api import Context, Student
from grader.grading import DEVICES, reference
from grader.judge import judge_exercise
from grader.manifest import load_manifest
from grader.registry import diagnoser, hidden_checks, public_checks
from grader.report import CheckResult, exercise_result, render_exercise
from grader.runner import run_checks

_public: dict[str, tuple[Callable, list[CheckResult]]] = {}


def _run(exercise_id: str, function: Callable, hidden: bool) -> list[CheckResult]:
    ex = load_manifest().exercise(exercise_id)
    checks = hidden_checks(ex) if hidden else public_checks(ex)
    seed = int(os.environ.get("GRADER_SEED", "0"))
    ctx = Context(seed, lab_devices(DEVICES), reference(ex.notebook) if hidden else None)
    namespace = getattr(function, "__globals__", {})
    outcomes = run_checks(checks, Student(namespace, ex.function, "this notebook"), ctx)
    result = judge_exercise(ex.id, ex.function, checks, outcomes, ctx, diagnoser(ex))
    return result.checks


def check(exercise_id: str, function: Callable, hidden: bool = False) -> float:
    """Run the checks of `exercise_id` on `function`, print the verdicts, return the points.

    With hidden=True (the instructor's copy of the notebook) it adds the hidden checks to
    the public ones just run on the same function.
    """
    ex = load_manifest().exercise(exercise_id)
    if not callable(function):
        raise TypeError(f"pass the function itself, e.g. check({exercise_id!r}, {ex.function})")
    if hidden:
        before = _public.get(exercise_id)
        public = (
            before[1] if before and before[0] is function else _run(exercise_id, function, False)
        )
        results = public + _run(exercise_id, function, True)
    else:
        results = _run(exercise_id, function, False)
        _public[exercise_id] = (function, results)
    result = exercise_result(ex.id, results)
    print(render_exercise(result, ex.title))
    return float(result.score)
