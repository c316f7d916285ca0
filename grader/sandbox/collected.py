"""What grading children report for a submission, and where a child was when it stopped."""

import threading
from dataclasses import dataclass, field

from grader.base.protocol import CaseOutcome, Note


class Phases:
    """Wall-clock seconds spent in each phase of grading, added up over children and
    submissions (for `make bench-grade`): starting a child up to its first report, loading
    notebooks, running cases, and judging (in grader.grading)."""

    NAMES = ("start-up", "notebook load", "cases", "judging")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.NAMES, 0.0)
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] += seconds


@dataclass
class Collected:
    """What the children reported for one submission."""

    outcomes: dict[str, dict[str, CaseOutcome]] = field(default_factory=dict)  # by exercise, case
    stopped: dict[str, str] = field(default_factory=dict)  # exercise -> why it did not finish
    changed: dict[str, list[str]] = field(default_factory=dict)  # exercise -> tampered names
    notes: dict[str, list[Note]] = field(default_factory=dict)  # notebook -> loading notes
    skip: dict[str, list[list[int]]] = field(default_factory=dict)  # notebook -> [cell, line]
    skip_notes: dict[str, list[Note]] = field(default_factory=dict)  # why they were skipped
    phases: Phases = field(default_factory=Phases)  # where the time went

    def progress(self, exercises: list) -> int:
        """Return how many cases of `exercises` have an outcome, plus those found tampering."""
        return sum(len(self.outcomes.get(ex.id, {})) + (ex.id in self.changed) for ex in exercises)


# ---- where a child was when it stopped ---------------------------------------------------


@dataclass(frozen=True)
class OnStatement:
    """A top-level statement of a notebook, while loading it."""

    notebook: str
    cell: int
    line: int


@dataclass(frozen=True)
class OnNotebook:
    """Loading a notebook, before its first statement."""

    notebook: str


@dataclass(frozen=True)
class OnCase:
    """A case of an exercise."""

    exercise: str
    case: str


@dataclass(frozen=True)
class OnExercise:
    """An exercise, between two of its cases."""

    exercise: str


Where = OnStatement | OnNotebook | OnCase | OnExercise | None


@dataclass(frozen=True)
class Stop:
    """How a child ended: where it was (None: between exercises, or done) and why ("": it
    ended as it should), in the reader's language; `limit` names the limit that stopped it,
    if one did (grader.sandbox.watching.over_a_limit)."""

    on: Where
    reason: str
    limit: str = ""
