"""Judge the outcomes of an exercise's cases, check by check, in the grader's own process."""

from collections.abc import Callable
from dataclasses import dataclass

from grader.api import Check, Context, Crash, Fail, Raised, raised_in
from grader.base.values import unpack
from grader.devices import grading_devices
from grader.judge.registry import diagnoser
from grader.judge.results import NOT_RUN, CheckResult, ExerciseResult, exercise_result
from grader.load.reference import reference
from grader.load.submission import Submission
from grader.manifest import Exercise
from grader.sandbox.collected import Collected
from grader.sandbox.supervisor import DEVICES

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
    if raised.stub:
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


def crash_hint(function: str) -> str:
    """Return the hint for an error no check knows: what to do to see it and fix it."""
    return (
        f"Fix the error first: call `{function}` in the notebook (the book's example) to see "
        "it; this check judges the calls that finish."
    )


def error_message(raised: Raised, function: str) -> str:
    """Describe an exception from the student's code in one line."""
    if raised.stub:
        return f"`{function}` is not written yet: it still raises NotImplementedError"
    if raised.type == "MissingFunction":
        return raised.message
    if raised.type == "TimeLimit":
        return f"`{function}` was stopped: {raised.message}"
    if out_of_memory(raised):
        return f"`{function}` hit the memory limit of the grading process ({raised.message[:160]})"
    where = f" ({raised.where})" if raised.where else ""
    return f"calling `{function}` raised {raised.type}: {raised.message}{where}"


def reference_time(outcome: dict) -> str:
    """Say how long the reference took on the same case, where the grader timed it."""
    if "reference_cpu" not in outcome:
        return ""
    return (
        f"; the reference solution needs {float(outcome['reference_cpu']):.1f} s of processor "
        "time on the same case on this machine"
    )


@dataclass
class Verdict:
    """A check's result, the crash that decided it (if one did), and the check that owns the
    cause of its failure (if it named one: see grader.api.Fail)."""

    result: CheckResult
    crash: Raised | None = None
    see: str | None = None
    judged: bool = True  # False: not judged at all (no outcome, or an `after` check failed)


def judge_check(
    check: Check,
    outcome: dict | None,
    ctx: Context,
    function: str,
    diagnose: Diagnose,
    verdicts: dict[str, bool],
    missing: str = "",
) -> Verdict:
    """Return the verdict on one check from its case's outcome."""

    def failed(message: str, hint: str | None, crash: Raised | None = None) -> Verdict:
        if check.case.holds and outcome is not None and outcome.get("held") is False:
            names = ", ".join(check.case.holds)
            message += (
                f" (this ran with your own {names}; the grader holds them right with the "
                "reference solution, so only this function counts there)"
            )
        result = CheckResult(
            check.name, False, 0.0, check.points, message, hint or check.hint, check.hidden
        )
        return Verdict(result, crash)

    def crashed(raised: Raised, nothing_finished: bool = False, calls: int = 1) -> Verdict:
        # The check's own hint is about what the calls that finish do: with no evidence of
        # that, only a hint about the error itself is shown.
        hint = common_hint(raised, function) or diagnose(raised) or crash_hint(function)
        message = error_message(raised, function)
        if nothing_finished and message.startswith(f"calling `{function}` raised "):
            if calls > 1:
                message = f"every call of `{function}` raised; the first: " + (
                    message.removeprefix(f"calling `{function}` raised ")
                )
            message = "could not judge this: " + message
        return failed(message, hint, raised)

    if outcome is None:
        verdict = failed(missing or "this check's case did not run", None)
        verdict.judged = False
        return verdict
    for before in check.after:
        if not verdicts.get(before, False):
            verdict = failed(f"not judged until `{before}` passes", f"Fix `{before}` first.")
            verdict.judged = False
            return verdict
    if "stopped" in outcome:
        return failed(str(outcome["stopped"]) + reference_time(outcome), LIMIT_HINT)
    if "error" in outcome:  # the case itself raised: no call of the student's finished
        verdict = crashed(Raised.from_data(outcome["error"]), nothing_finished=True)
        verdict.result.message += reference_time(outcome)
        return verdict
    seen = unpack(outcome.get("value"))
    try:
        check.judge(seen, ctx.for_case(check.case.name))
    except Crash as crash:  # the check needed a call that raised
        return crashed(crash.raised, crash.every_call, crash.calls)
    except Fail as fail:
        crash = raised_in(seen)
        if crash is None:
            verdict = failed(fail.message, fail.hint)
            verdict.see = fail.see
            return verdict
        # What was recorded before the crash was not enough: say where it stopped.
        message = f"{fail.message}; `{function}` stopped early: {error_message(crash, function)}"
        hint = fail.hint or check.hint
        about = common_hint(crash, function) or diagnose(crash)
        if about and not says_the_same(about, hint):
            hint += f" About the error it stopped with: {about}"
        return failed(message, hint, crash)
    except Exception as error:  # a result of a shape the check did not foresee
        return failed(f"the result could not be judged ({type(error).__name__}: {error})", None)
    return Verdict(CheckResult(check.name, True, check.points, check.points, "", "", check.hidden))


def says_the_same(one: str, other: str) -> bool:
    """Return True when many of the longer words of `one` are in `other` already."""

    def words(text: str) -> set[str]:
        return {w.strip(".,:;`'").lower() for w in text.split() if len(w) > 3}

    mine = words(one)
    return bool(mine) and len(mine & words(other)) >= 0.4 * len(mine)


def name_what_a_crash_blocked(verdicts: list[Verdict]) -> None:
    """Add to each check failed by a crash the other checks the same crash failed."""
    groups: dict[tuple[str, str, str], list[CheckResult]] = {}
    for v in verdicts:
        # (the stub and a missing function are nothing written: they block nothing)
        if v.crash is not None and not v.crash.stub and v.crash.type != "MissingFunction":
            key = (v.crash.type, v.crash.message, v.crash.where)
            groups.setdefault(key, []).append(v.result)
    for results in groups.values():
        if len(results) > 1:
            for r in results:
                others = ", ".join(o.name for o in results if o is not r)
                r.message += f" (the same error also failed: {others})"  # (report.results)


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
    judged = []
    for c in checks:
        verdict = judge_check(
            c, outcomes.get(c.case.name), ctx, function, diagnose, verdicts, missing
        )
        verdicts[c.name] = verdict.result.passed
        judged.append(verdict)
    name_what_a_crash_blocked(judged)
    paid_once(judged)
    return exercise_result(exercise_id, [v.result for v in judged], notes)


def paid_once(judged: list[Verdict]) -> None:
    """Give its points back to each check that failed for a cause another check owns, where
    that check was judged and failed for a cause of its own; its message says which (see
    grader.api.Fail)."""
    charged = {v.result.name for v in judged if not v.result.passed and v.judged and not v.see}
    for v in judged:
        if v.see is not None and v.see in charged:
            r = v.result
            r.passed, r.points, r.hint = True, r.max_points, ""
            said = r.message.splitlines()[0]
            said = said if len(said) <= 100 else said[:99] + "…"
            r.message = f"kept its points: `{v.see}` charges for the same cause ({said})"


def not_checked(exercise_id: str, checks: list[Check], problem: str) -> ExerciseResult:
    """Return the result of an exercise whose notebook cannot be checked at all (not a
    notebook, or not the lab's): every check failed without running, and one note that says
    why and what to do."""
    results = [CheckResult(c.name, False, 0.0, c.points, NOT_RUN, "", c.hidden) for c in checks]
    return exercise_result(exercise_id, results, [problem])


def judge_reported(
    ex: Exercise,
    checks: list[Check],
    sub: Submission,
    collected: Collected,
    seed: int,
    hidden: bool,
) -> ExerciseResult:
    """Judge one exercise of a submission from what its children reported."""
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
