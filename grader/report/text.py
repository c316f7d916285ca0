"""The results of grading as text (grader.judge.results): an exercise's, a submission's."""

import re
from functools import cache

from grader.judge.results import NOT_RUN, ExerciseResult, SubmissionResult
from labtext import LANGUAGES, _, translate

MAX_NOTES = 8
# What grader.judge.verdicts makes of a failure's message when other checks failed of the same
# error: the report shows that error once, and says for the others that it is the same.
ALSO_FAILED = "{message} (the same error also failed: {checks})"
SECONDS = re.compile(r"(?<![\d.])\d+(\.\d+)?(?: s\b| ?秒)")  # "0.8 s" or "0.8秒"


@cache
def _also_failed() -> tuple[re.Pattern, ...]:
    """Return, for each language, a pattern of a message that ALSO_FAILED was made of."""
    patterns = []
    for template in dict.fromkeys(translate(language, ALSO_FAILED) for language in LANGUAGES):
        pattern = re.escape(template)
        pattern = pattern.replace(re.escape("{message}"), "(?P<message>.*)", 1)
        pattern = pattern.replace(re.escape("{checks}"), ".+?", 1)
        patterns.append(re.compile(pattern, re.S))
    return tuple(patterns)


def error_alone(message: str) -> str:
    """Return a failure's message without what says which other checks the same error failed
    (in whichever language the message was made)."""
    for pattern in _also_failed():
        if found := pattern.fullmatch(message):
            return found["message"]
    return message


@cache
def _not_run_said() -> frozenset[str]:
    return frozenset(translate(lang, NOT_RUN) for lang in LANGUAGES)


def not_run(message: str) -> bool:
    """Return True for the message of a check that did not run (`NOT_RUN`, in any language)."""
    return message in _not_run_said()


def _points(x: float) -> str:
    return f"{x:g}"


def out_of(score: float, checked: float, total: float | None) -> str:
    """Say the points earned out of the total; where hidden checks (not run here) hold part
    of it, say so, and what the checks run here hold."""
    if total is None or total <= checked:
        return _("{score}/{total} points").format(score=_points(score), total=_points(checked))
    return _(
        "{score}/{total} points (the public checks hold {public}; "
        "hidden checks, run when your work is graded, the other {hidden})"
    ).format(
        score=_points(score),
        total=_points(total),
        public=_points(checked),
        hidden=_points(total - checked),
    )


def render_exercise(result: ExerciseResult, title: str = "", total: float | None = None) -> str:
    """Return the exercise's verdicts as text for a terminal or a notebook; `total`: what the
    exercise is worth in all, where hidden checks were not run."""
    passed = sum(c.passed for c in result.checks)
    title = _(title)  # (a title of the manifest, in English there)
    heading = _("{name} ({title})").format(name=result.name, title=title) if title else result.name
    if total is not None and total > result.max_score:
        said = _("{exercise}: {passed} of {count} public checks passed, {points}")
    else:
        said = _("{exercise}: {passed} of {count} checks passed, {points}")
    lines = [
        said.format(
            exercise=heading,
            passed=passed,
            count=len(result.checks),
            points=out_of(result.score, result.max_score, total),
        )
    ]
    lines += [f"  ! {note}" for note in result.notes]
    if result.checks and all(not_run(c.message) for c in result.checks):
        return "\n".join(lines)  # the note says it all: nothing ran
    width = max((len(c.name) for c in result.checks), default=0)
    earlier: dict[str, str] = {}  # a failure's message (the error alone) -> the check that said it
    for c in result.checks:
        mark = "✓" if c.passed else "✗"
        points = f"{_points(c.points)}/{_points(c.max_points)}"
        if c.hidden:
            points = _("{points} (hidden)").format(points=points)
        lines.append(f"  {mark} {c.name.ljust(width)}  {points}")
        core = error_alone(c.message)
        key = SECONDS.sub("N", core)  # (a deadlock's seconds differ from case to case)
        if not c.passed and key in earlier:  # one error is shown once per exercise
            lines.append("      " + _("the same as {check} above").format(check=earlier[key]))
            continue
        if c.message:  # a failure, or a check that kept its points for another's sake
            lines += [f"      {line}" for line in core.strip().splitlines()]
            if not c.passed:
                earlier[key] = f"`{c.name}`"
        if not c.passed and c.hint:
            lines.append("      " + _("hint: {hint}").format(hint=c.hint))
    return "\n".join(lines)


def render_submission(
    result: SubmissionResult,
    titles: dict[str, str] | None = None,
    totals: dict[str, float] | None = None,
) -> str:
    """Return a whole submission's verdicts as text; `totals`: what each exercise is worth
    in all, where hidden checks were not run."""
    titles, totals = titles or {}, totals or {}
    whole = sum(totals.get(e.name, e.max_score) for e in result.exercises) if totals else None
    parts = [
        _("{id}: {score}/{total} points").format(
            id=result.id, score=_points(result.score), total=_points(result.max_score)
        )
    ]
    if whole is not None and whole > result.max_score:
        parts[0] = _("{id}: {score}/{total} points (hidden checks hold {hidden} of them)").format(
            id=result.id,
            score=_points(result.score),
            total=_points(whole),
            hidden=_points(whole - result.max_score),
        )
    parts += [
        render_exercise(e, titles.get(e.name, ""), totals.get(e.name)) for e in result.exercises
    ]
    if result.notes:
        shown = result.notes[:MAX_NOTES]
        more = len(result.notes) - len(shown)
        parts.append(
            "\n".join(
                [_("While loading the notebooks:")]
                + [f"  - {note}" for note in shown]
                + (["  " + _("... and {more} more").format(more=more)] if more else [])
            )
        )
    return "\n\n".join(parts)
