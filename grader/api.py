"""The vocabulary of a checks module: cases, checks, failures and comparisons.

How to add a check
------------------
1. In `grader/checks/<exercise>.py` (the module the manifest names), write a *case*: a
   function of (student, ctx, **params) that calls the student's code and returns what it
   saw. It runs in the grading child, next to the student's code. Call the function the
   exercise asks for as `student.fn`; swap another of the student's names for the case's
   length with `with student.replaced(lenet=recorder): ...`, and a library's name with
   `unittest.mock.patch.object`. Use `ctx.devices`.
   Inputs come one way: as the case's parameters (see `using` below), and whatever is
   random, from a function of the case's seed, `ctx.seed`, such as `float_lists(ctx.seed)`
   (`grader.fixtures.seeded(ctx.seed)` is a generator started from it). The check calls the
   same function to know what went in.
   A case whose code must run in every process of a group (the distributed exercises)
   hands a function to `grader.ranks.in_every_size`, and records the group's calls with
   `grader.ranks.recording_calls`.
2. Write a *check*: a function of (seen, ctx) that returns when the property holds and
   raises `Fail` (through `expect`, `expect_equal`, `expect_close`) when it does not. It
   runs in the grader's own process. Give it points and a hint that names the mistake.
3. Make the exercise's points in `grader/manifest.toml` the sum of its checks' points (a
   test makes sure), and run `make exercises`.

    @case
    def book_demo(student, ctx):
        data = [torch.ones((1, 2), device=ctx.devices[i]) * (i + 1) for i in range(2)]
        student.fn(data)
        return data

    @check(book_demo, points=2, hint="Add every other tensor into data[0], then copy it back.")
    def both_devices_hold_threes(seen, ctx):
        for t in seen:
            expect_equal(t, torch.tensor([[3.0, 3.0]]), "each tensor after allreduce")

A variant of a case, with other inputs, is `book_demo.using("name", "what it does", n=4)`:
its parameters are values, or functions of ctx that the grader computes from the case's seed.
Hidden checks (`grader/hidden/<exercise>.py`) use public cases this way, so that their
inputs stay on the instructor's side. `@error_hints` declares a function that turns an error
the student's code raised into a hint naming the mistake.

One mistake should cost the checks about it, and no others:
- a case that records what the student's code does on the way (a training loop) calls it
  through `attempt`, so that a crash at the end still leaves what happened before it to
  judge; a check that needs the call to have finished says so with `returned(...)`;
- a case that calls the student's function, which in turn calls the student's other
  functions, names those in `holds`: where the reference solution is at hand (the
  instructor's side) they are replaced by the reference's for the case, so that a wrong
  `allreduce` costs the checks of `allreduce`, not those of `train_batch` as well;
- `after=` on a check names the checks that must pass first, so that a side property
  earns nothing for code that got the main result wrong;
- `Fail(..., see="other_check")` (or `expect(..., see=...)`) says that a failure has the
  cause another check judges: where that check fails too, this one keeps its points.
"""

import dataclasses
import functools
import hashlib
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch import Tensor

from grader.sandbox.transport import SeenTensor

# What a checks module uses; the rest of this module is the grader's own.
__all__ = [
    "Fail",
    "attempt",
    "case",
    "check",
    "close",
    "error_hints",
    "expect",
    "expect_close",
    "expect_equal",
    "returned",
    "short",
]


class Fail(Exception):
    """A check failed: `message` says what came back and what was expected.

    `see` names another check of the exercise that judges the same cause (a bucket too big
    makes both the bucket size and the count of calls wrong): when that check fails too, this
    one keeps its points and its message says "see ...", so that one mistake is paid once.
    When that check passes, this is a failure like any other."""

    def __init__(self, message: str, hint: str | None = None, see: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.see = see


class MissingFunction(Exception):
    """The submission does not define the function an exercise asks for."""


class Stub(NotImplementedError):
    """The student's function is still the released stub (found without calling it)."""


@functools.cache
def _library_folders() -> tuple[str, ...]:
    """Return the folders of code that is not the student's: Python's own, the installed
    packages, and the lab's `grader` and `dplab`."""
    import sysconfig
    from pathlib import Path

    paths = sysconfig.get_paths()
    lab = Path(__file__).resolve().parent.parent
    folders = [paths["stdlib"], paths["purelib"], paths["platlib"], lab / "grader", lab / "dplab"]
    return tuple(f"{Path(f).resolve()}/" for f in folders)


def is_stub(error: BaseException) -> bool:
    """Return True when `error` is the released stub's NotImplementedError: raised by a line
    `raise NotImplementedError...` of the student's own code (a notebook cell), not by a
    library (PyTorch raises NotImplementedError for what a device or a class lacks)."""
    import linecache
    import os

    if isinstance(error, Stub):
        return True
    if not isinstance(error, NotImplementedError) or error.__traceback__ is None:
        return False
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    filename = code.co_filename
    if not (
        filename.startswith("<") or not os.path.realpath(filename).startswith(_library_folders())
    ):
        return False
    line = linecache.getline(filename, tb.tb_lineno).strip()
    if line:
        return line.startswith("raise NotImplementedError")
    return _raises_not_implemented(code, tb.tb_lasti, tb.tb_lineno)


def _raises_not_implemented(code, offset: int, lineno: int) -> bool:
    """Return True when the instruction at `offset` is a raise, on a line that names
    NotImplementedError (for code whose source is not at hand: exec'd text)."""
    import dis

    steps = list(dis.get_instructions(code))
    raised = next((i for i in steps if i.offset == offset), None)
    if raised is None or raised.opname != "RAISE_VARARGS":
        return False
    on_line = [i for i in steps if i.positions and i.positions.lineno == lineno]
    return any(i.argval == "NotImplementedError" for i in on_line)


MAX_TRACE = 2000


@dataclass(frozen=True)
class Raised:
    """An exception from the student's code: its type, message and where it happened;
    `stub` when it is the released stub's NotImplementedError (see `is_stub`)."""

    type: str
    message: str
    where: str
    trace: str
    stub: bool = False

    @classmethod
    def from_exception(cls, error: BaseException) -> "Raised":
        frames = traceback.extract_tb(error.__traceback__)
        mine = [f for f in frames if "code cell" in f.filename or "<string>" in f.filename]
        where = ""
        if mine:
            last = mine[-1]
            where = f"{last.filename.strip('<>')}, line {last.lineno}, in {last.name}"
        trace = "".join(traceback.format_list(mine)) if mine else ""
        name, stub = type(error).__name__, is_stub(error)
        if isinstance(error, Stub):  # what the student's stub raises
            name = "NotImplementedError"
        return cls(name, str(error)[:1000], where, trace[-MAX_TRACE:], stub)

    def as_data(self) -> dict:
        return {
            "type": self.type,
            "message": self.message,
            "where": self.where,
            "trace": self.trace,
            "stub": self.stub,
        }

    @classmethod
    def from_data(cls, data: dict) -> "Raised":
        texts = (str(data.get(k, "")) for k in ("type", "message", "where", "trace"))
        return cls(*texts, bool(data.get("stub", False)))


class Crash(Exception):
    """Raised by a check that needs a call of the student's code that raised instead."""

    def __init__(self, raised: Raised) -> None:
        super().__init__(raised.message)
        self.raised = raised


def attempt(fn: Callable, *args: Any, **kwargs: Any) -> dict:
    """Call the student's `fn`; return {"returned": value} or, if it raised, {"raised": ...}.

    Unlike a plain call, a crash does not end the case: what the case recorded before it
    is still sent back and judged. The stub (its `raise NotImplementedError`, see `is_stub`)
    and a missing function are not crashes: they end the case, as there is nothing to judge.
    A NotImplementedError from anywhere else (PyTorch's, say) is a crash like any other.
    """
    try:
        return {"returned": fn(*args, **kwargs), "raised": None}
    except MissingFunction:
        raise
    except (Exception, SystemExit) as error:
        if is_stub(error):
            raise
        return {"returned": None, "raised": Raised.from_exception(error).as_data()}


def raised_in(seen: Any) -> Raised | None:
    """Return the crash recorded by `attempt` in what a case saw, if any."""
    if isinstance(seen, dict) and isinstance(seen.get("raised"), dict):
        return Raised.from_data(seen["raised"])
    return None


def returned(seen: dict) -> Any:
    """Return what the call recorded by `attempt` returned, or raise Crash if it raised."""
    crash = raised_in(seen)
    if crash is not None:
        raise Crash(crash)
    return seen.get("returned")


@dataclass
class Context:
    """What a case or a check may use besides the student's code."""

    seed: int
    devices: list[torch.device] = field(default_factory=list)
    reference: dict | None = None  # the reference notebook's names (hidden checks only)

    def for_case(self, name: str) -> "Context":
        """Return a copy whose seed depends on the case's name, so cases are independent."""
        digest = hashlib.sha256(f"{self.seed}:{name}".encode()).digest()
        return Context(int.from_bytes(digest[:6], "big"), self.devices, self.reference)


class Student:
    """The student's namespace, seen through the exercise's function name."""

    def __init__(self, namespace: dict, function: str, where: str = "the notebook") -> None:
        self.namespace = namespace
        self.function = function
        self.where = where

    @property
    def fn(self) -> Callable:
        """Return the function the exercise asks for, or say that it is missing."""
        found = self.namespace.get(self.function)
        if not callable(found):
            what = "is not a function" if self.function in self.namespace else "is not defined"
            raise MissingFunction(
                f"`{self.function}` {what} in {self.where}: keep the name given in the notebook"
            )
        return found

    def get(self, name: str, default: Any = None) -> Any:
        """Return another name the student's code defines (such as `lenet` or `loss`)."""
        return self.namespace.get(name, default)

    def replaced(self, **names: Any) -> Any:
        """Return a context in which the student's `names` are the given values (and, after,
        what they were): `with student.replaced(lenet=recorder): ...`."""
        return mock.patch.dict(self.namespace, names)


@dataclass(frozen=True)
class Case:
    """A call of the student's code; `run(student, ctx, **params)` returns what it observed.

    Case functions live in the public checks modules, the only ones the grading child
    imports. A hidden check runs a public case function under a name of its own and with
    its own parameters (`using`), so its inputs and its judgement stay with the grader.
    """

    name: str
    run: Callable[..., Any]
    doc: str
    origin: tuple[str, str]  # the module and name of the case function
    params: Mapping[str, Any] = field(default_factory=dict)
    holds: tuple[str, ...] = ()  # names held right with the reference's while it runs

    def using(self, name: str, doc: str = "", **params: Any) -> "Case":
        """Return this case function under another name, with parameters.

        A parameter may be a function of the context (ctx -> value): the grader computes
        it, from the case's seed, and sends the child only the value.
        """
        return dataclasses.replace(self, name=name, doc=doc or self.doc, params=params)

    def arguments(self, ctx: Context) -> dict[str, Any]:
        """Return the parameters, with those that depend on the seed computed for `ctx`."""
        return {k: v(ctx) if callable(v) else v for k, v in self.params.items()}


@dataclass(frozen=True)
class Check:
    """One property of one exercise, judged from a case's outcome."""

    name: str
    case: Case
    judge: Callable[[Any, Context], None]
    points: float
    hint: str
    doc: str
    after: tuple[str, ...] = ()
    hidden: bool = False


def case(run: Callable[..., Any] | None = None, *, holds: tuple[str, ...] = ()) -> Any:
    """Declare a case: a function of (student, ctx, **params) that calls the student's code.

    `@case` alone, or `@case(holds=("split_batch", "allreduce"))` for a case whose calls
    reach those names of the student's notebook: they are held right (see the module
    docstring).
    """

    def declare(fn: Callable[..., Any]) -> Case:
        doc = (fn.__doc__ or "").strip()
        return Case(fn.__name__, fn, doc, (fn.__module__, fn.__name__), holds=tuple(holds))

    return declare(run) if run is not None else declare


@dataclass(frozen=True)
class ErrorHints:
    """A checks module's hints for errors that the student's code raised (see `error_hints`)."""

    hint_for: Callable[[Raised], str | None]


def error_hints(fn: Callable[[Raised], str | None]) -> ErrorHints:
    """Declare a function that names the mistake behind an error the student's code raised
    (Raised -> a hint, or None when it does not know it); the grader finds it as it finds
    the checks, and asks it before showing a crashed check's own hint."""
    return ErrorHints(fn)


def check(
    on: Case, points: float, hint: str, after: tuple[str, ...] | str = ()
) -> Callable[[Callable[[Any, Context], None]], Check]:
    """Declare a check on case `on`, worth `points`, with the `hint` shown when it fails.

    `after` names checks that must pass first: a check of a side property (such as "no
    two results share memory") earns nothing for code that got the main result wrong.
    """

    def wrap(judge: Callable[[Any, Context], None]) -> Check:
        names = (after,) if isinstance(after, str) else tuple(after)
        return Check(judge.__name__, on, judge, points, hint, (judge.__doc__ or "").strip(), names)

    return wrap


# ---- comparisons that explain themselves -------------------------------------------------


def short(value: Any, limit: int = 12) -> str:
    """Describe a tensor (or anything) briefly: small tensors in full, big ones by shape."""
    if isinstance(value, SeenTensor):
        value = value.value
    if isinstance(value, Tensor):
        if value.numel() <= limit:
            body = str(value.tolist())
        else:
            head = ", ".join(f"{v:.4g}" for v in value.flatten()[:4].tolist())
            body = f"shape {tuple(value.shape)} starting [{head}, ...]"
        return f"{body} ({str(value.dtype).removeprefix('torch.')})"
    if isinstance(value, list | tuple):  # each item briefly: a tensor's repr runs to pages
        items = [short(item, limit) for item in value[:4]]
        if len(value) > 4:
            items.append(f"... {len(value)} items in all")
        if isinstance(value, list):
            return f"[{', '.join(items)}]"
        return f"({', '.join(items)}{',' if len(value) == 1 else ''})"
    return repr(value)


def as_tensor(value: Any, what: str) -> Tensor:
    """Return the tensor inside `value`, or fail saying that `what` was not a tensor."""
    if isinstance(value, SeenTensor):
        return value.value
    if isinstance(value, Tensor):  # computed by the grader itself
        return value
    raise Fail(f"{what}: expected a tensor, got {short(value)}")


def expect(condition: bool, message: str, hint: str | None = None, see: str | None = None) -> None:
    """Fail with `message` unless `condition` holds (`see`: the check that owns the cause,
    as `Fail` says)."""
    if not condition:
        raise Fail(message, hint, see)


def _same_shape(actual: Tensor, expected: Tensor, what: str) -> None:
    if actual.shape != expected.shape:
        raise Fail(
            f"{what}: came back with shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        )


def expect_equal(value: Any, expected: Tensor, what: str, hint: str | None = None) -> None:
    """Fail unless `value` is a tensor exactly equal to `expected` (same shape and dtype)."""
    actual = as_tensor(value, what)
    _same_shape(actual, expected, what)
    if actual.dtype != expected.dtype:
        raise Fail(f"{what}: came back as {actual.dtype}, expected {expected.dtype}", hint)
    if not torch.equal(actual, expected):
        raise Fail(f"{what}: came back {short(actual)}, expected {short(expected)}", hint)


def expect_close(
    value: Any,
    expected: Tensor,
    what: str,
    hint: str | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-6,
) -> None:
    """Fail unless `value` is a tensor close to `expected`, naming the largest difference."""
    actual = as_tensor(value, what)
    _same_shape(actual, expected, what)
    actual = actual.to(torch.float64)
    target = expected.to(torch.float64)
    if torch.isnan(actual).any() and not torch.isnan(target).any():
        raise Fail(f"{what}: came back with NaN values, expected {short(expected)}", hint)
    if not torch.allclose(actual, target, rtol=rtol, atol=atol):
        gap = (actual - target).abs()
        worst = divmod_index(int(gap.argmax()), tuple(actual.shape))
        raise Fail(
            f"{what}: came back {short(actual.to(expected.dtype))}, expected {short(expected)}; "
            f"the largest difference is {float(gap.max()):.3g} at index {worst}",
            hint,
        )


def divmod_index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Turn a flat index into a multi-dimensional one."""
    index = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))


def close(a: Tensor, b: Tensor, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
    """Return True when two tensors have the same shape and close values."""
    return a.shape == b.shape and torch.allclose(
        a.to(torch.float64), b.to(torch.float64), rtol=rtol, atol=atol
    )
