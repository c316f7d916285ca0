"""What crosses between the grader and a grading child, as typed messages: the request it
runs, the frames it reports with, the grader's replies, each case's outcome (kept by the
grader and judged, also where a kernel's `check()` ran the case itself), and the orders the
grader gives the fork server.

A message is written as plain data with `to_plain` and read back with `from_plain`, which
checks every field against its type: a frame that lacks a field, or holds a value of another
type, is refused as a whole. grader.sandbox.frames carries the plain data as bytes.
"""

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from grader.base.limits import Limits
from grader.base.outcomes import Raised


@dataclass(frozen=True)
class CaseOutcome:
    """What running one case gave: its value (packed, see grader.base.values) or what it
    raised, what it printed, and its times; or why the grader stopped it."""

    case: str = ""
    # True: it ran with the reference's functions for the names it holds; False: it did not
    # (it holds none, or ran with the student's own); None: it never ran (stopped).
    held: bool | None = None
    value: Any = None
    error: Raised | None = None  # what the case raised
    printed: str = ""
    seconds: float | None = None  # wall clock
    cpu_seconds: float | None = None
    # Set by the grader, never by the child: why it stopped the case (in the reader's
    # language), the limit that did ("" for none), and the reference's processor time on
    # the same case where the grader timed it (grader.sandbox.retiming).
    stopped: str | None = None
    limit: str = ""
    reference_cpu: float | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None

    def as_the_child_ran_it(self) -> "CaseOutcome":
        """Return this outcome without what only the grader may set (a frame could hold it)."""
        return dataclasses.replace(self, stopped=None, limit="", reference_cpu=None)


@dataclass(frozen=True)
class CellRef:
    """A code cell, as a student finds it in JupyterLab (dplab.notebook.cell_parts): by its
    grade id, the function or class it defines, its first line, or, empty, its number; or a
    cell of code the grader runs, by its number ("code", "reference")."""

    kind: str  # "grade id", "defines", "first line", "empty", "code" or "reference"
    name: str = ""  # the grade id, the name defined or the first line
    number: int = 0  # among the code cells, from 1

    def in_english(self) -> str:
        """Return the cell's name as the code's file name holds it: reports find the
        student's frames by it (", cell "), and never a reference cell's."""
        if self.kind in ("code", "reference"):
            return f"{self.kind} cell {self.number}"
        from dplab.notebook import label_of  # (where a cell is loaded, dplab is)

        return "cell " + label_of(self.kind, self.name, self.number)


@dataclass(frozen=True)
class Note:
    """What loading or grading a notebook noted, said in the reader's language (`text`), of a
    kind (NOTE_KINDS), about a code cell where it names one (`cell`), in a notebook where it
    names one (`notebook`: the report says it before the text)."""

    kind: str
    text: str
    cell: CellRef | None = None
    notebook: str = ""

    def __str__(self) -> str:
        return f"{self.notebook}: {self.text}" if self.notebook else self.text

    def about(self, exercise_id: str, function: str) -> bool:
        """Return True for a note about a cell of the exercise: its solution or check cell
        (by grade id), or the cell that defines its function."""
        cell = self.cell
        if cell is None:
            return False
        return (cell.kind == "grade id" and cell.name.startswith(f"{exercise_id}-")) or (
            cell.kind == "defines" and cell.name == function
        )


NOTE_KINDS = (
    "magic",  # a line of IPython syntax (%, !) left out
    "syntax",  # a cell that is not Python: nothing of it ran
    "call-skipped",  # a top-level call of a training function, not run
    "stopped",  # a statement stopped at the time limit
    "raised",  # a statement that raised (loading went on)
    "skipped",  # a statement that stopped a child, skipped when loading again
    "unloadable",  # the notebook itself could not be read
)


# ---- the grader's request ------------------------------------------------------------------


@dataclass(frozen=True)
class ChildRequest:
    """What a grading child is asked to do, written to a file it reads (then deletes) before
    it touches the student's code: the cases to run and where, in what language, and the
    child's ends of its two pipes."""

    nonce: str  # every frame carries it (grader.sandbox.frames)
    fd: int  # the pipe the child reports on
    reply_fd: int  # the pipe it reads the grader's replies from
    seed: int
    language: str  # of what the child says: the submission's
    terminal: str  # of its notes to whoever runs the command
    devices: int  # stand-in devices the checks use (grader.base.grading_devices)
    threads: int
    scratch: str  # the child's own folder
    private: list[str]  # folders it must not read (grader.sandbox.fence)
    limits: Limits  # what its cases and their ranks may use
    asks: bool  # whether it asks (Claim) before each case: another loop of children may have it
    skip: dict[str, list[list[int]]]  # notebook -> [cell, line] of statements not to run
    notebooks: dict[str, str]  # notebook -> its copy in the scratch folder
    # [exercise, [[case name, [module, attribute], arguments], ...]], in the order to run
    exercises: list[list[Any]]


def request_from_plain(data: object) -> ChildRequest:
    """Return the ChildRequest that `data` holds; raise ValueError if it holds none."""
    return _read(ChildRequest, data)


@dataclass(frozen=True)
class ForkOrder:
    """What the grader asks the fork server for (grader.sandbox.fast.forkserver, over its
    socket, with the child's descriptors): a child forked, limited and fenced, that runs the
    request file `request` in `scratch`."""

    kind: ClassVar[str] = "fork"
    request: str
    scratch: str
    env: dict[str, str]
    uid: int | None  # the child's own user id, where the fence gives it one
    fence: dict[str, Any]  # grader.sandbox.fence.Fence, as data
    private: list[str]
    tmp: str  # the child's temporary folder, a file system of its own where it can be
    memory_gib: float
    complete: bool = False  # its cases start process groups: it needs every server import


ORDERS: dict[str, type] = {ForkOrder.kind: ForkOrder}


# ---- the child's frames ---------------------------------------------------------------------


@dataclass(frozen=True)
class Loading:
    """The child begins to load a notebook."""

    kind: ClassVar[str] = "loading"
    notebook: str


@dataclass(frozen=True)
class Statement:
    """The child is about to run a top-level statement of the notebook it loads."""

    kind: ClassVar[str] = "statement"
    notebook: str
    cell: int
    line: int


@dataclass(frozen=True)
class NotebookLoaded:
    """The child has loaded a notebook (`failed`: it could not), with what it noted."""

    kind: ClassVar[str] = "loaded"
    notebook: str
    notes: list[Note] = field(default_factory=list)
    failed: bool = False
    seconds: float | None = None


@dataclass(frozen=True)
class ExerciseStart:
    kind: ClassVar[str] = "exercise-start"
    exercise: str


@dataclass(frozen=True)
class Claim:
    """May this child run the case? (The grader answers with Go.)"""

    kind: ClassVar[str] = "claim"
    exercise: str
    case: str


@dataclass(frozen=True)
class Held:
    """Which reference cells define `names`? (The grader answers with HeldCells.)"""

    kind: ClassVar[str] = "held"
    exercise: str
    names: list[str]


@dataclass(frozen=True)
class CaseStart:
    kind: ClassVar[str] = "case-start"
    exercise: str
    case: str


@dataclass(frozen=True)
class CaseDone:
    kind: ClassVar[str] = "case"
    exercise: str
    case: str
    outcome: CaseOutcome


@dataclass(frozen=True)
class ExerciseDone:
    """The child is done with an exercise: the names that its code changed where it should
    not have (see grader.base.tampering), or why its notebook could not be loaded."""

    kind: ClassVar[str] = "exercise-done"
    exercise: str
    changed: list[str] = field(default_factory=list)
    unloadable: str = ""


Frame = (  # in the order a child sends them
    ExerciseStart
    | Claim
    | Loading
    | Statement
    | NotebookLoaded
    | Held
    | CaseStart
    | CaseDone
    | ExerciseDone
)
FRAMES: dict[str, type] = {cls.kind: cls for cls in typing.get_args(Frame)}


# ---- the grader's replies -------------------------------------------------------------------


@dataclass(frozen=True)
class Go:
    """The answer to a Claim."""

    kind: ClassVar[str] = "go"
    go: bool


@dataclass(frozen=True)
class HeldCells:
    """The answer to Held: the reference's cells, or None where the grader gives none."""

    kind: ClassVar[str] = "held-cells"
    cells: list[str] | None


Reply = Go | HeldCells
REPLIES: dict[str, type] = {cls.kind: cls for cls in typing.get_args(Reply)}


# ---- plain data -----------------------------------------------------------------------------


def to_plain(message) -> dict:
    """Return a frame, a reply or an outcome as plain data (a frame's and a reply's with its
    kind)."""
    plain = {f.name: _plain(getattr(message, f.name)) for f in dataclasses.fields(message)}
    kind = getattr(type(message), "kind", None)
    return {"kind": kind, **plain} if kind else plain


def _plain(value):
    if dataclasses.is_dataclass(value):
        return to_plain(value)
    return [_plain(v) for v in value] if type(value) is list else value


def from_plain(data: object, known: dict[str, type] = FRAMES):
    """Return the message of `known` (the frames, or REPLIES) that `data` holds; raise
    ValueError if it holds none, or a field of the wrong type."""
    if not isinstance(data, dict) or data.get("kind") not in known:
        raise ValueError("not a message of the grader's protocol")
    return _read(known[data["kind"]], {k: v for k, v in data.items() if k != "kind"})


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    """Return the fields of a message class with their types (read once per class)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _read(cls: type, data: object):
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: not a dict")
    hints = _fields(cls)
    names = hints.keys()
    if not set(data) <= names:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(set(data) - names)}")
    try:
        return cls(**{name: _value(hints[name], value) for name, value in data.items()})
    except TypeError as error:  # a field without a default is missing
        raise ValueError(f"{cls.__name__}: {error}") from None


def _value(kind, value):
    """Return `value` read as `kind`, or raise ValueError."""
    if kind is Any:
        return value
    if dataclasses.is_dataclass(kind):
        return _read(kind, value)
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(kind):
            try:
                return _value(option, value)
            except ValueError:
                continue
        raise ValueError(f"{value!r:.60} is not {kind}")
    if origin is list:
        (item,) = typing.get_args(kind)
        if type(value) is not list:
            raise ValueError(f"{value!r:.60} is not a list")
        return [_value(item, v) for v in value]
    if origin is dict or kind is dict:
        if type(value) is not dict:
            raise ValueError(f"{value!r:.60} is not a dict")
        return value
    if kind is type(None):
        if value is not None:
            raise ValueError(f"{value!r:.60} is not None")
        return None
    if kind is float and type(value) is int:
        return float(value)
    if type(value) is not kind:
        raise ValueError(f"{value!r:.60} is not {kind.__name__}")
    return value
