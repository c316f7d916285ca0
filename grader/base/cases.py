"""Cases and checks, and how a checks module declares them."""

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch

from grader.base.limits import Limits
from grader.base.outcomes import MissingFunction, Raised
from labtext import N_, _


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

    def __init__(
        self,
        namespace: dict,
        function: str,
        where: str = N_("the notebook"),
        limits: Limits | None = None,
    ) -> None:
        self.namespace = namespace
        self.function = function
        self.where = where
        self.limits = limits or Limits()  # what its code may use (its groups of ranks too)

    @property
    def fn(self) -> Callable:
        """Return the function the exercise asks for, or say that it is missing."""
        found = self.namespace.get(self.function)
        if not callable(found):
            if self.function in self.namespace:
                said = _(
                    "`{function}` is not a function in {where}: keep the name given in the notebook"
                )
            else:
                said = _(
                    "`{function}` is not defined in {where}: keep the name given in the notebook"
                )
            # (`where`: a notebook's file name, or "the notebook", which has a translation)
            raise MissingFunction(said.format(function=self.function, where=_(self.where)))
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
    doc: str  # what it proves, as the student reads it (translated)
    after: tuple[str, ...] = ()
    because: str = ""  # why the `after` checks must pass first: the one reason a gate may have
    hidden: bool = False
    # For the maintainer, from the docstring's `Property:` line on: the property it proves,
    # and whether it compares with the reference or through a relation (docs/grading.md).
    judged: str = ""


def split_doc(docstring: str | None) -> tuple[str, str]:
    """A check's docstring as (what it proves, from the `Property:` line on)."""
    lines = (docstring or "").strip().splitlines()
    at = next((i for i, line in enumerate(lines) if line.strip().startswith("Property:")), None)
    if at is None:
        return "\n".join(lines), ""
    return "\n".join(lines[:at]).strip(), " ".join(" ".join(lines[at:]).split())


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


def check_on(
    on: Case,
    points: float,
    hint: str,
    after: tuple[str, ...] | str = (),
    because: str = "",
) -> Callable[[Callable[[Any, Context], None]], Check]:
    """Declare a check on case `on`, worth `points`, with the `hint` shown when it fails.

    `after` names checks that must pass first, and `because` says in one line why: a gate
    is allowed only where this check cannot observe its property unless those pass (a
    refusal of bad input means nothing from code that refuses good input too). Where only
    some results hide the property, the check raises `Unobserved` for those instead.
    """

    def wrap(judge: Callable[[Any, Context], None]) -> Check:
        names = (after,) if isinstance(after, str) else tuple(after)
        doc, judged = split_doc(judge.__doc__)
        return Check(
            judge.__name__, on, judge, points, hint, doc, names, because.strip(), judged=judged
        )

    return wrap


# ---- comparisons that explain themselves -------------------------------------------------
