"""Results of grading, as dataclasses, and how they are written out and shown."""

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class CheckResult:
    """The verdict on one check."""

    name: str  # the check's function name, which says what it proves
    passed: bool
    points: float  # points earned: all of max_points or none
    max_points: float
    message: str  # what came back against what was expected ("" when passed, but for a check
    # that kept its points because another check charges for the same cause)
    hint: str  # the likely mistake and what to do ("" when passed)
    hidden: bool = False  # hidden checks exist only on the instructor's side


@dataclass
class ExerciseResult:
    """The verdicts on one exercise's checks."""

    name: str  # the exercise id from the manifest
    score: float
    max_score: float
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # problems that concern the whole exercise


@dataclass
class SubmissionResult:
    """Everything about one submission."""

    id: str
    path: str
    score: float
    max_score: float
    exercises: list[ExerciseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what loading the notebooks reported
    seconds: float = 0.0  # wall time of grading it
    fingerprint: str = ""  # of the notebooks, the grader and the options: same means same result

    @classmethod
    def from_dict(cls, data: dict) -> "SubmissionResult":
        """Rebuild a result read back from a JSON report."""
        exercises = [
            ExerciseResult(
                e["name"],
                e["score"],
                e["max_score"],
                [CheckResult(**c) for c in e["checks"]],
                list(e.get("notes", [])),
            )
            for e in data["exercises"]
        ]
        fields = {k: data[k] for k in ("id", "path", "score", "max_score")}
        return cls(
            **fields,
            exercises=exercises,
            notes=list(data.get("notes", [])),
            seconds=float(data.get("seconds", 0.0)),
            fingerprint=str(data.get("fingerprint", "")),
        )


def exercise_result(
    name: str,
    checks: list[CheckResult],
    notes: list[str] | None = None,
    max_score: float | None = None,
) -> ExerciseResult:
    """Sum the checks' points into an exercise result."""
    total = sum(c.max_points for c in checks) if max_score is None else max_score
    return ExerciseResult(name, sum(c.points for c in checks), total, checks, notes or [])


def submission_result(
    sub_id: str, path: str, exercises: list[ExerciseResult], notes: list[str]
) -> SubmissionResult:
    """Sum the exercises' scores into a submission result."""
    return SubmissionResult(
        sub_id,
        path,
        sum(e.score for e in exercises),
        sum(e.max_score for e in exercises),
        exercises,
        notes,
    )


def write_atomically(path: Path, text: str) -> None:
    """Write a file so that a reader sees the old or the new content, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(results: list[SubmissionResult], path: Path) -> None:
    """Write the JSON report (see the README for its fields)."""
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


def _points(x: float) -> str:
    return f"{x:g}"


def render_exercise(result: ExerciseResult, title: str = "") -> str:
    """Return the exercise's verdicts as text for a terminal or a notebook."""
    passed = sum(c.passed for c in result.checks)
    heading = f"{result.name}" + (f" ({title})" if title else "")
    lines = [
        f"{heading}: {passed} of {len(result.checks)} checks passed, "
        f"{_points(result.score)}/{_points(result.max_score)} points"
    ]
    lines += [f"  ! {note}" for note in result.notes]
    width = max((len(c.name) for c in result.checks), default=0)
    for c in result.checks:
        mark = "✓" if c.passed else "✗"
        tag = " (hidden)" if c.hidden else ""
        lines.append(
            f"  {mark} {c.name.ljust(width)}  {_points(c.points)}/{_points(c.max_points)}{tag}"
        )
        if c.message:  # a failure, or a check that kept its points for another's sake
            lines.append(f"      {c.message}")
        if not c.passed and c.hint:
            lines.append(f"      hint: {c.hint}")
    return "\n".join(lines)


def render_submission(result: SubmissionResult, titles: dict[str, str] | None = None) -> str:
    """Return a whole submission's verdicts as text."""
    titles = titles or {}
    parts = [f"{result.id}: {_points(result.score)}/{_points(result.max_score)} points"]
    parts += [render_exercise(e, titles.get(e.name, "")) for e in result.exercises]
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
