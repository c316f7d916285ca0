"""Write the results of grading out, read them back, and show them (grader.judge.results)."""

import json
import os
import re
import tempfile
from dataclasses import asdict
from pathlib import Path

from grader.judge.results import NOT_RUN, ExerciseResult, SubmissionResult


def write_atomically(path: Path, text: str) -> None:
    """Write a file so that a reader sees the old or the new content, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(results: list[SubmissionResult], path: Path) -> None:
    """Write the JSON report (docs/grading.md lists its fields)."""
    payload = {"submissions": [asdict(r) for r in results]}
    write_atomically(path, json.dumps(payload, indent=2) + "\n")


def read_json(path: Path) -> list[SubmissionResult]:
    """Read a JSON report back; an unreadable file gives no results (they will be graded)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return [SubmissionResult.from_dict(s) for s in data["submissions"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


MAX_NOTES = 8
ALSO_FAILED = " (the same error also failed: "  # see grader.judge.verdicts
SECONDS = re.compile(r"\b\d+(\.\d+)? s\b")


def _points(x: float) -> str:
    return f"{x:g}"


def out_of(score: float, checked: float, total: float | None) -> str:
    """Say the points earned out of the total; where hidden checks (not run here) hold part
    of it, say so, and what the checks run here hold."""
    if total is None or total <= checked:
        return f"{_points(score)}/{_points(checked)} points"
    return (
        f"{_points(score)}/{_points(total)} points (the public checks hold {_points(checked)}; "
        f"hidden checks, run when your work is graded, the other {_points(total - checked)})"
    )


def render_exercise(result: ExerciseResult, title: str = "", total: float | None = None) -> str:
    """Return the exercise's verdicts as text for a terminal or a notebook; `total`: what the
    exercise is worth in all, where hidden checks were not run."""
    passed = sum(c.passed for c in result.checks)
    heading = f"{result.name}" + (f" ({title})" if title else "")
    public = " public" if total is not None and total > result.max_score else ""
    lines = [
        f"{heading}: {passed} of {len(result.checks)}{public} checks passed, "
        + out_of(result.score, result.max_score, total)
    ]
    lines += [f"  ! {note}" for note in result.notes]
    if result.checks and all(c.message == NOT_RUN for c in result.checks):
        return "\n".join(lines)  # the note says it all: nothing ran
    width = max((len(c.name) for c in result.checks), default=0)
    said: dict[str, str] = {}  # a failure's message (the error alone) -> the check that said it
    for c in result.checks:
        mark = "✓" if c.passed else "✗"
        tag = " (hidden)" if c.hidden else ""
        lines.append(
            f"  {mark} {c.name.ljust(width)}  {_points(c.points)}/{_points(c.max_points)}{tag}"
        )
        core = c.message.split(ALSO_FAILED)[0]
        key = SECONDS.sub("N s", core)  # (a deadlock's seconds differ from case to case)
        if not c.passed and key in said:  # one error is shown once per exercise
            lines.append(f"      the same as {said[key]} above")
            continue
        if c.message:  # a failure, or a check that kept its points for another's sake
            lines += [f"      {line}" for line in core.strip().splitlines()]
            if not c.passed:
                said[key] = f"`{c.name}`"
        if not c.passed and c.hint:
            lines.append(f"      hint: {c.hint}")
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
    parts = [f"{result.id}: {_points(result.score)}/{_points(result.max_score)} points"]
    if whole is not None and whole > result.max_score:
        parts[0] = (
            f"{result.id}: {_points(result.score)}/{_points(whole)} points (hidden checks hold "
            f"{_points(whole - result.max_score)} of them)"
        )
    parts += [
        render_exercise(e, titles.get(e.name, ""), totals.get(e.name)) for e in result.exercises
    ]
    if result.notes:
        shown = result.notes[:MAX_NOTES]
        more = len(result.notes) - len(shown)
        parts.append(
            "\n".join(
                ["While loading the notebooks:"]
                + [f"  - {note}" for note in shown]
                + ([f"  ... and {more} more"] if more else [])
            )
        )
    return "\n\n".join(parts)
