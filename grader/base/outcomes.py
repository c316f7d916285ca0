"""What a case saw of the student's code: what it returned, what it raised, and failures."""

import functools
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class Fail(Exception):
    """A check failed: `message` says what came back and what was expected.

    `see` names another check of the exercise that judges the same cause (a bucket too big
    makes both the bucket size and the count of calls wrong): when that check fails too, this
    one keeps its points and its message says "see ...", so that one mistake is paid once.
    When that check passes, this is a failure like any other. `cause`, where given, tells
    this failure's cause from others' better than its message can (a deadlock's message says
    how long the ranks idled, which differs from case to case)."""

    def __init__(
        self, message: str, hint: str | None = None, see: str | None = None, cause: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.see = see
        self.cause = cause


class Stopped(Fail):
    """A group of ranks did not finish: it deadlocked, ran out of time, or lost a rank. The
    check that owns the cause charges it; another check that names that one (`see`) saw
    nothing of its own property where that one fails too, and earns nothing for it
    (grader.judge.verdicts.paid_once)."""


class Unobserved(Exception):
    """A check cannot see its property, because what it looks at is missing for a cause that
    check `until` judges (copies that are not a list of tensors, say): it earns nothing and
    charges nothing, and its message says why in one line (`because`). Where the property can
    be seen on part of what came back, a check judges that part instead."""

    def __init__(self, until: str, because: str) -> None:
        super().__init__(because)
        self.until = until
        self.because = because


def observe(condition: object, until: str, because: str) -> None:
    """Raise Unobserved(until, because) unless `condition` holds."""
    if not condition:
        raise Unobserved(until, because)


class MissingFunction(Exception):
    """The submission does not define the function an exercise asks for."""


class Stub(NotImplementedError):
    """The student's function is still the released stub (found without calling it)."""


@functools.cache
def _library_folders() -> tuple[str, ...]:
    """Return the folders of code that is not the student's: Python's own, the installed
    packages, and the lab's `grader`, `dplab` and `labtext`."""
    import sysconfig
    from pathlib import Path

    paths = sysconfig.get_paths()
    lab = Path(__file__).resolve().parents[2]
    folders = [paths["stdlib"], paths["purelib"], paths["platlib"]]
    folders += [lab / "grader", lab / "dplab", lab / "labtext"]
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
        mine = [f for f in frames if ", cell " in f.filename or "<string>" in f.filename]
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
    """Raised by a check that needs a call of the student's code that raised instead;
    `every_call` when no call that the check could judge finished, of `calls` (the first
    error is `raised`): the check then says it could not judge. `see`, as Fail's: the check
    that charges for the same error, where it saw it."""

    def __init__(
        self, raised: Raised, every_call: bool = False, calls: int = 2, see: str | None = None
    ) -> None:
        super().__init__(raised.message)
        self.raised = raised
        self.every_call = every_call
        self.calls = calls
        self.see = see  # the check that charges for this error, where it does (as Fail's)


# Errors of a whole group of ranks, not of a call the student's code made in it: a rank's
# process died, or gloo stopped the group for calls that did not match (grader.ranks.judging);
# and the grader's refusals (grader.sandbox.audit, grader.ranks.pools). A check that met one
# saw nothing of its own property.
GROUP_CRASHES = ("RankFailed", "CallsMismatched", "Fenced", "Tampered")


@contextmanager
def charged_by(check: str) -> Iterator[None]:
    """Name `check` as the one that charges any failure raised inside that names no other:
    a second check whose failures have the cause `check` judges against the reference keeps
    its points where `check` fails too (see Fail's `see`)."""
    try:
        yield
    except (Fail, Crash) as failure:
        failure.see = failure.see or check
        raise


@dataclass
class Attempt:
    """One call of the student's function (`attempt`): what it returned, or what it raised;
    and, for a rank's call, when it ended (time.monotonic)."""

    returned: Any = None
    raised: Raised | None = None
    at: float | None = None


def attempt(fn: Callable, *args: Any, **kwargs: Any) -> Attempt:
    """Call the student's `fn`; return what it returned or, if it raised, what it raised.

    Unlike a plain call, a crash does not end the case: what the case recorded before it
    is still sent back and judged. The stub (its `raise NotImplementedError`, see `is_stub`)
    and a missing function are not crashes: they end the case, as there is nothing to judge.
    A NotImplementedError from anywhere else (PyTorch's, say) is a crash like any other.
    """
    try:
        return Attempt(fn(*args, **kwargs))
    except MissingFunction:
        raise
    except (Exception, SystemExit) as error:
        if is_stub(error):
            raise
        return Attempt(raised=Raised.from_exception(error))


def finished(outcomes: list) -> list[int]:
    """Return the indices of the calls that did not raise; if every call raised, raise Crash.

    A check about one property judges the calls that finished, so a crash on one input (a
    list size, an uneven batch) costs the checks about that input, not the others."""
    done = [i for i, o in enumerate(outcomes) if raised_in(o) is None]
    if not done:
        raise Crash(raised_in(outcomes[0]), every_call=True, calls=len(outcomes))
    return done


def all_finished(outcomes: list) -> None:
    """Raise Crash with the first call that raised, if any did (saying whether every one did)."""
    crashes = [raised_in(o) for o in outcomes]
    first = next((r for r in crashes if r is not None), None)
    if first is not None:
        every = all(r is not None for r in crashes)
        raise Crash(first, every_call=every, calls=len(outcomes))


def raised_in(seen: Any) -> Raised | None:
    """Return the crash recorded in what a case saw, if any: an Attempt's, or that of a
    case's own record of one (a dict whose "raised" holds it)."""
    if isinstance(seen, Attempt):
        return seen.raised
    if isinstance(seen, dict) and isinstance(seen.get("raised"), Raised):
        return seen["raised"]
    return None


def ended_at(seen: Any) -> float:
    """Return when the call recorded in what a rank saw ended (see raised_in; 0 if unknown)."""
    at = (
        seen.at if isinstance(seen, Attempt) else seen.get("at") if isinstance(seen, dict) else None
    )
    return float(at) if isinstance(at, int | float) else 0.0


def returned(seen: Any) -> Any:
    """Return what the call recorded in what a case saw returned (an Attempt's, or that of a
    case's own record of one: its "returned"), or raise Crash if it raised."""
    crash = raised_in(seen)
    if crash is not None:
        raise Crash(crash, every_call=True, calls=1)  # the one call the check needs
    return seen.returned if isinstance(seen, Attempt) else seen.get("returned")
