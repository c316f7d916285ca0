"""Judge the outcomes of an exercise's cases, check by check, in the grader's own process."""

import re
from collections.abc import Callable
from dataclasses import dataclass

from grader.api import Check, Context, Crash, Fail, Raised, Stopped, Unobserved, raised_in
from grader.base.outcomes import GROUP_CRASHES
from grader.base.protocol import CaseOutcome
from grader.base.results import CheckResult, ExerciseResult, exercise_result
from grader.base.values import unpack
from grader.ranks.judging import mismatch_hint
from labtext import N_, _

Diagnose = Callable[[Raised], str | None]
_HAN = re.compile(r"[\u4e00-\u9fff]+")  # Chinese characters
_LATIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
LIMIT_HINT = N_(
    "The grading process running this check stopped (a time limit, the memory limit, a "
    "crash or an exit): look for an endless loop, a huge tensor, os._exit or ctypes."
)


def out_of_memory(raised: Raised) -> bool:
    """Return True for an allocation refused by the memory limit."""
    return raised.type == "MemoryError" or "can't allocate memory" in raised.message


def common_hint(raised: Raised, function: str) -> str | None:
    """Return the hint for errors that any exercise can meet."""
    if raised.type == "TimeLimit":
        return _("Look for a loop that never ends, or work far bigger than the check needs.")
    if out_of_memory(raised):
        return _(
            "The code asked for more memory than a grading process may use; the checks "
            "need only small tensors, so look for a size that grows out of hand."
        )
    if raised.stub:
        return _(
            "Replace `raise NotImplementedError` in `{function}` with your code, then check again."
        ).format(function=function)
    if raised.type == "MissingFunction":
        return _("Define `{function}` with the name and parameters the notebook gives.").format(
            function=function
        )
    message = raised.message
    if raised.type == "TypeError" and (
        "positional argument" in message or "unexpected keyword" in message
    ):
        return _("Keep the parameters of `{function}` as the notebook gives them.").format(
            function=function
        )
    if raised.type == "NameError":
        return _("A name is used before it is defined: run the notebook's cells from the top.")
    return None


def crash_hint(function: str) -> str:
    """Return the hint for an error no check knows: what to do to see it and fix it."""
    return _(
        "Fix the error first: call `{function}` in the notebook (the book's example) to see "
        "it; this check judges the calls that finish."
    ).format(function=function)


# How an error that no call survived is said: (nothing finished, more than one call, where known)
_RAISED = {
    (False, False, True): N_("calling `{function}` raised {error}: {message} ({where})"),
    (False, False, False): N_("calling `{function}` raised {error}: {message}"),
    (True, False, True): N_(
        "could not judge this: calling `{function}` raised {error}: {message} ({where})"
    ),
    (True, False, False): N_(
        "could not judge this: calling `{function}` raised {error}: {message}"
    ),
    (True, True, True): N_(
        "could not judge this: every call of `{function}` raised; the first: {error}: "
        "{message} ({where})"
    ),
    (True, True, False): N_(
        "could not judge this: every call of `{function}` raised; the first: {error}: {message}"
    ),
}


def error_message(
    raised: Raised, function: str, nothing_finished: bool = False, calls: int = 1
) -> str:
    """Describe an exception from the student's code in one line; where `nothing_finished`,
    a plain error says that the check could not judge (every call of `calls` raised)."""
    if raised.stub:
        return _("`{function}` is not written yet: it still raises NotImplementedError").format(
            function=function
        )
    if raised.type == "MissingFunction":
        return _(raised.message)
    if raised.type == "TimeLimit":
        return _("`{function}` was stopped: {why}").format(function=function, why=_(raised.message))
    if out_of_memory(raised):
        return _("`{function}` hit the memory limit of the grading process ({error})").format(
            function=function, error=raised.message[:160]
        )
    form = _RAISED[nothing_finished, nothing_finished and calls > 1, bool(raised.where)]
    return _(form).format(
        function=function, error=raised.type, message=raised.message, where=raised.where
    )


def with_reference_time(message: str, outcome: CaseOutcome) -> str:
    """Add to `message` how long the reference took on the same case, where the grader timed
    it."""
    if outcome.reference_cpu is None:
        return message
    return _(
        "{message}; the reference solution needs {seconds} s of processor "
        "time on the same case on this machine"
    ).format(message=message, seconds=f"{outcome.reference_cpu:.1f}")


@dataclass
class Verdict:
    """A check's result, the crash that decided it (if one did), and the check that owns the
    cause of its failure (if it named one: see grader.api.Fail)."""

    result: CheckResult
    crash: Raised | None = None
    see: str | None = None
    observed: bool = True  # False: failed without seeing its property (no outcome, a gate,
    # every call raised, or Unobserved): nothing is charged for a cause of its own
    stopped: bool = False  # its group of ranks never finished (Stopped, a group's crash)

    @property
    def charged(self) -> bool:
        """Return True when the check lost its points for a cause it saw itself."""
        return not self.result.passed and self.observed


@dataclass
class _Judging:
    """One check being judged from its case's outcome, and the failed verdicts it can give."""

    check: Check
    outcome: CaseOutcome | None
    function: str
    diagnose: Diagnose

    def failed(
        self, message: str, hint: str | None, crash: Raised | None = None, cause: str = ""
    ) -> Verdict:
        """Return a failed verdict, its message saying where the case held other names right;
        `cause` tells its cause from others' ("": its message does)."""
        check = self.check
        # Hints are translated here: a check's own, and the constants the checks modules
        # mark with N_ (one already translated has no msgid, and comes back as it is).
        if check.case.holds and self.outcome is not None and self.outcome.held is False:
            message = _(
                "{message} (this ran with your own {names}; the grader holds them right with "
                "the reference solution, so only this function counts there)"
            ).format(message=message, names=", ".join(check.case.holds))
        result = CheckResult(
            check.name,
            False,
            0.0,
            check.points,
            message,
            _(hint or check.hint),
            check.hidden,
            cause=cause,
            doc=check.doc,
        )
        return Verdict(result, crash)

    def crashed(self, raised: Raised, nothing_finished: bool = False, calls: int = 1) -> Verdict:
        """Return the verdict on a check that a call of the student's function decided by
        raising `raised`."""
        # The check's own hint is about what the calls that finish do: with no evidence of
        # that, only a hint about the error itself is shown.
        function = self.function
        hint = (
            common_hint(raised, function)
            or self.diagnose(raised)
            or mismatch_hint(raised)
            or crash_hint(function)
        )
        return self.failed(error_message(raised, function, nothing_finished, calls), hint, raised)

    def unjudged(self, message: str, hint: str | None) -> Verdict:
        """Return the verdict on a check that failed without seeing its property."""
        verdict = self.failed(message, hint)
        verdict.observed = False
        return verdict

    def stopped_early(self, fail: Fail, crash: Raised) -> Verdict:
        """Return the verdict on a check that failed on what was recorded before the student's
        code raised `crash`."""
        # What was recorded before the crash was not enough: say where it stopped.
        function = self.function
        message = _("{message}; `{function}` stopped early: {error}").format(
            message=_(fail.message), function=function, error=error_message(crash, function)
        )
        hint = _(fail.hint or self.check.hint)
        about = common_hint(crash, function) or self.diagnose(crash) or mismatch_hint(crash)
        if about and not says_the_same(_(about), hint):
            hint = _("{hint} About the error it stopped with: {about}").format(
                hint=hint, about=_(about)
            )
        return self.failed(message, hint, crash)

    def judged(self, seen: object, ctx: Context) -> Verdict:
        """Return the verdict of the check's own judge on what its case saw."""
        check = self.check
        try:
            check.judge(seen, ctx.for_case(check.case.name))
        except Crash as crash:  # the check needed a call that raised
            verdict = self.crashed(crash.raised, crash.every_call, crash.calls)
            verdict.observed = not crash.every_call
            verdict.see = crash.see
            verdict.stopped = crash.raised.type in GROUP_CRASHES
            return verdict
        except Unobserved as blind:
            return self.unjudged(
                _("not judged: {because} (`{check}` judges that)").format(
                    because=_(blind.because), check=blind.until
                ),
                _("Fix `{check}` first.").format(check=blind.until),
            )
        except Fail as fail:
            crash = raised_in(seen)
            if crash is not None:
                return self.stopped_early(fail, crash)
            verdict = self.failed(_(fail.message), fail.hint, cause=fail.cause)
            verdict.see = fail.see
            verdict.stopped = isinstance(fail, Stopped)
            return verdict
        except Exception as error:  # a result of a shape the check did not foresee
            return self.failed(
                _("the result could not be judged ({error}: {message})").format(
                    error=type(error).__name__, message=error
                ),
                None,
            )
        return Verdict(
            CheckResult(
                check.name, True, check.points, check.points, "", "", check.hidden, doc=check.doc
            )
        )


def judge_check(
    check: Check,
    outcome: CaseOutcome | None,
    ctx: Context,
    function: str,
    diagnose: Diagnose,
    verdicts: dict[str, bool],
    missing: str = "",
) -> Verdict:
    """Return the verdict on one check from its case's outcome."""
    judging = _Judging(check, outcome, function, diagnose)
    if outcome is None:
        return judging.unjudged(missing or _("this check's case did not run"), None)
    for before in check.after:
        if not verdicts.get(before, False):
            return judging.unjudged(
                _("not judged until `{check}` passes: {because}").format(
                    check=before, because=_(check.because)
                ),
                _("Fix `{check}` first.").format(check=before),
            )
    if outcome.stopped is not None:  # (said by the supervisor, in the reader's language)
        return judging.failed(with_reference_time(_(outcome.stopped), outcome), LIMIT_HINT)
    if outcome.error is not None:  # the case itself raised: no call of the student's finished
        verdict = judging.crashed(outcome.error, nothing_finished=True)
        verdict.result.message = with_reference_time(verdict.result.message, outcome)
        verdict.observed = False
        return verdict
    return judging.judged(unpack(outcome.value), ctx)


def says_the_same(one: str, other: str) -> bool:
    """Return True when many of the longer words of `one` are in `other` already."""

    def words(text: str) -> set[str]:
        if _HAN.search(text):  # Chinese: its pairs of characters, and the code it names
            pairs = {run[i : i + 2] for run in _HAN.findall(text) for i in range(len(run) - 1)}
            return pairs | {w.lower() for w in _LATIN.findall(text) if len(w) > 3}
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
                r.also_failed = [o.name for o in results if o is not r]


def judge_exercise(
    exercise_id: str,
    function: str,
    checks: list[Check],
    outcomes: dict[str, CaseOutcome],
    ctx: Context,
    diagnose: Diagnose,
    notes: list[str] | None = None,
    missing: str = "",
) -> ExerciseResult:
    """Judge every check of an exercise in order (so `after` can look at earlier verdicts)."""
    judged = judge_verdicts(function, checks, outcomes, ctx, diagnose, missing)
    return exercise_result(exercise_id, [v.result for v in judged], notes)


def judge_verdicts(
    function: str,
    checks: list[Check],
    outcomes: dict[str, CaseOutcome],
    ctx: Context,
    diagnose: Diagnose,
    missing: str = "",
) -> list[Verdict]:
    """Return the verdict on every check, in order, each failure paid once (`paid_once`)."""
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
    return judged


def paid_once(judged: list[Verdict]) -> None:
    """Give its points back to each check that failed for a cause another check owns, where
    that check saw its property fail for a cause of its own (or, in turn, for one a third
    check charges); its message names the check that charges (see grader.api.Fail). A check
    that saw nothing (not judged, or every call raised) charges for nothing, and gets its
    points back only where the owner saw its cause (code that finished no call anywhere
    earns nothing). A check whose
    ranks never finished (a deadlock, a limit, the grader's refusal) where the check that
    owns that cause failed too gets no points back: it saw nothing of its own property,
    and fails without charging."""
    failed = {
        v.result.name: v
        for v in judged
        if not v.result.passed and (v.observed or v.crash is not None)
    }

    def charging(name: str | None) -> str | None:
        """Return the last failed check of the chain of `see`s from `name` (a chain that
        ends at a check that passed, or was not judged, ends with the one before it), or None
        in a loop. A check on the chain whose every call raised failed for the cause too."""
        chain: list[str] = []
        while name in failed and name not in chain:
            chain.append(name)
            name = failed[name].see
        return None if name in chain or not chain else chain[-1]

    owners = {id(v): charging(v.see) for v in judged if v.see is not None}
    for v in judged:
        owner = owners.get(id(v))
        if owner is not None and not v.observed and not failed[owner].observed:
            owner = None  # no call finished here nor for the owner: the code did no work
        if owner is not None and v.stopped:  # ranks that never finished show it nothing
            v.observed = False
            v.result.kept_for = owner  # it could not judge: the owner charges for that
        elif owner is not None:
            r = v.result
            r.passed, r.points, r.hint, r.kept_for = True, r.max_points, "", owner


def not_checked(exercise_id: str, checks: list[Check], problem: str) -> ExerciseResult:
    """Return the result of an exercise whose notebook cannot be checked at all (not a
    notebook, or not the lab's): every check failed without running, and one note that says
    why and what to do."""
    results = [
        CheckResult(c.name, False, 0.0, c.points, "", "", c.hidden, not_run=True, doc=c.doc)
        for c in checks
    ]
    return exercise_result(exercise_id, results, [problem])
