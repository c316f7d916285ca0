"""The verdicts of grading, as dataclasses: a check's, an exercise's, a submission's."""

from dataclasses import dataclass, field

from grader.base.protocol import CellRef, Note


@dataclass
class CheckResult:
    """The verdict on one check, its facts as fields: the report makes them text, once, in
    the reader's language (grader.report.text.check_said)."""

    name: str  # the check's function name, which says what it proves
    passed: bool
    points: float  # points earned: all of max_points or none
    max_points: float
    message: str  # what came back against what was expected, in the check's own words ("" when
    # passed, but for a check that kept its points because another check charges the cause)
    hint: str  # the likely mistake and what to do ("" when passed)
    hidden: bool = False  # hidden checks exist only on the instructor's side
    not_run: bool = False  # its notebook cannot be checked at all: nothing ran (see the notes)
    also_failed: list[str] = field(default_factory=list)  # other checks the same error failed
    # The check that charges for this one's cause (grader.api.Fail's `see`): passed, this one
    # kept its points; failed, its ranks never finished and it could not judge.
    kept_for: str = ""
    cause: str = ""  # what this failure's cause is, to tell one cause from another ("" for
    # its message): two failures of one cause are shown once
    doc: str = ""  # what the check proves (its docstring, in English)


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
    notes: list[Note] = field(default_factory=list)  # what loading the notebooks reported
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
            notes=[note_from_dict(n) for n in data.get("notes", [])],
            seconds=float(data.get("seconds", 0.0)),
            fingerprint=str(data.get("fingerprint", "")),
            language=str(data.get("language", "en")),
        )


def note_from_dict(data: dict | str) -> Note:
    """Rebuild a note read back from a JSON report (one written before notes were typed
    holds its text alone)."""
    if isinstance(data, str):
        return Note("note", data)
    cell = data.get("cell")
    ref = CellRef(**cell) if isinstance(cell, dict) else None
    return Note(data["kind"], data["text"], ref, data.get("notebook", ""))


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
    sub_id: str, path: str, exercises: list[ExerciseResult], notes: list[Note]
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
