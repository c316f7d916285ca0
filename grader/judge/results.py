"""The verdicts of grading, as dataclasses: a check's, an exercise's, a submission's."""

from dataclasses import dataclass, field

from labtext import N_

# A check's message, shown as `_(NOT_RUN)` (grader.report.text knows it in every language)
NOT_RUN = N_("not run: its notebook cannot be checked (see the note above)")


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
    language: str = "en"  # what its messages (and its feedback file) are written in

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
            language=str(data.get("language", "en")),
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
