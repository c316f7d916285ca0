"""Judge the outcomes of an exercise's cases, check by check, in the grader's own process."""

from collections.abc import Callable

from grader.api import Check, Context, Fail
from grader.report import CheckResult, ExerciseResult, exercise_result
from grader.runner import Raised
from grader.transport import unpack

Diagnose = Callable[[Raised], str | None]
LIMIT_HINT = (
    "The grading process running this check stopped (a time limit, the memory limit, a "
    "crash or an exit): look for an endless loop, a huge tensor, os._exit or ctypes."
)


def out_of_memory(raised: Raised) -> bool:
    """Return True for an allocation refused by the memory limit."""
    return raised.type == "MemoryError" or "can't allocate memory" in raised.message


def common_hint(raised: Raised, function: str) -> str | None:
    """Return the hint for errors that any exercise can meet."""
    if raised.type == "TimeLimit":
        return "Look for a loop that never ends, or work far bigger than the check needs."
    if out_of_memory(raised):
        return (
            "The code asked for more memory than a grading process may use; the checks "
            "need only small tensors, so look for a size that grows out of hand."
        )
    if raised.type == "NotImplementedError":
        return (
            f"Replace `raise NotImplementedError` in `{function}` with your code, then check again."
        )
    if raised.type == "MissingFunction":
        return f"Define `{function}` with the name and parameters the notebook gives."
    message = raised.message
    if raised.type == "TypeError" and (
        "positional argument" in message or "unexpected keyword" in message
    ):
        return f"Keep the parameters of `{function}` as the notebook gives them."
    if raised.type == "NameError":
        return "A name is used before it is defined: run the notebook's cells from the top."
    return None


def error_message(raised: Raised, function: str) -> str:
    """Describe an exception from the student's code in one line."""
    if raised.type == "NotImplementedError":
        return f"`{function}` is not written yet: it still raises NotImplementedError"
    if raised.type == "MissingFunction":
        return raised.message
    if raised.type == "TimeLimit":
        return f"`{function}` was stopped: {raised.message}"
    if out_of_memory(raised):
        return f"`{function}` hit the memory limit of the grading process ({raised.message[:160]})"
    where = f" ({raised.where})" if raised.where else ""
    return f"calling `{function}` raised {raised.type}: {raised.message}{where}"


def judge_check(
    check: Check,
    outcome: dict | None,
    ctx: Context,
    function: str,
    diagnose: Diagnose,
    verdicts: dict[str, bool],
    missing: str = "",
) -> CheckResult:
    """Return the verdict on one check from its case's outcome."""

    def failed(message: str, hint: str | None) -> CheckResult:
        return CheckResult(
            check.name, False, 0.0, check.points, message, hint or check.hint, check.hidden
        )

    if outcome is None:
        return failed(missing or "this check's case did not run", None)
    for before in check.after:
        if not verdicts.get(before, False):
            return failed(f"not judged until `{before}` passes", f"Fix `{before}` first.")
    if "stopped" in outcome:
        return failed(str(outcome["stopped"]), LIMIT_HINT)
    if "error" in outcome:
        raised = Raised.from_data(outcome["error"])
        hint = common_hint(raised, function) or diagnose(raised)
        return failed(error_message(raised, function), hint)
    seen = unpack(outcome.get("value"))
    try:
        check.judge(seen, ctx.for_case(check.case.name))
    except Fail as fail:
        return failed(fail.message, fail.hint)
    except Exception as error:  # a result of a shape the check did not foresee
        return failed(f"the result could not be judged ({type(error).__name__}: {error})", None)
    return CheckResult(check.name, True, check.points, check.points, "", "", check.hidden)


def judge_exercise(
    exercise_id: str,
    function: str,
    checks: list[Check],
    outcomes: dict[str, dict],
    ctx: Context,
    diagnose: Diagnose,
    notes: list[str] | None = None,
    missing: str = "",
) -> ExerciseResult:
    """Judge every check of an exercise in order (so `after` can look at earlier verdicts)."""
    verdicts: dict[str, bool] = {}
    results = []
    for c in checks:
        result = judge_check(
            c, outcomes.get(c.case.name), ctx, function, diagnose, verdicts, missing
        )
        verdicts[c.name] = result.passed
        results.append(result)
    return exercise_result(exercise_id, results, notes)
