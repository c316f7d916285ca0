"""The results of grading as text (grader.base.results): an exercise's, a submission's."""

from grader.base.results import CheckResult, ExerciseResult, SubmissionResult
from labtext import N_, _

MAX_NOTES = 8
# What a check whose notebook cannot be checked at all says (CheckResult.not_run)
NOT_RUN = N_("not run: its notebook cannot be checked (see the note above)")
SAID_LENGTH = 100  # of the first line of a failure quoted in a kept check's message


def quoted(message: str) -> str:
    """Return the first line of `message`, cut to SAID_LENGTH characters."""
    said = message.splitlines()[0] if message else ""
    return said if len(said) <= SAID_LENGTH else said[: SAID_LENGTH - 1] + "…"


def check_said(check: CheckResult, alone: bool = False) -> str:
    """Return what a check says of itself, made from its facts in the reader's language:
    its own words, with the checks the same error also failed (not where `alone`: the text
    report points to the first instead), or why it kept its points or could not judge."""
    if check.not_run:
        return _(NOT_RUN)
    if check.kept_for and check.passed:
        return _("kept its points: `{check}` charges for the same cause ({said})").format(
            check=check.kept_for, said=quoted(check.message)
        )
    if check.kept_for:
        return _(
            "could not judge this: the ranks did not finish ({said}); `{check}` charges for that"
        ).format(said=quoted(check.message), check=check.kept_for)
    if check.also_failed and not alone:
        return _("{message} (the same error also failed: {checks})").format(
            message=check.message, checks=", ".join(check.also_failed)
        )
    return check.message


def same_cause(check: CheckResult) -> str:
    """Return what tells the cause of a check's failure from others' within an exercise."""
    return check.cause or check.message


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
    if result.checks and all(c.not_run for c in result.checks):
        return "\n".join(lines)  # the note says it all: nothing ran
    width = max((len(c.name) for c in result.checks), default=0)
    earlier: dict[str, str] = {}  # a failure's message (the error alone) -> the check that said it
    for c in result.checks:
        mark = "✓" if c.passed else "✗"
        points = f"{_points(c.points)}/{_points(c.max_points)}"
        if c.hidden:
            points = _("{points} (hidden)").format(points=points)
        lines.append(f"  {mark} {c.name.ljust(width)}  {points}")
        core = check_said(c, alone=True)
        key = same_cause(c)
        if not c.passed and key in earlier:  # one error is shown once per exercise
            lines.append("      " + _("the same as {check} above").format(check=earlier[key]))
            continue
        if core:  # a failure, or a check that kept its points for another's sake
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
