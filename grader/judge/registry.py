"""Find each exercise's checks and error diagnoses from the modules the manifest names."""

import dataclasses
import importlib
from types import ModuleType

from grader.api import Check, ErrorHints, Raised
from grader.load.notebook import cells_by_grade_id
from grader.manifest import Exercise, exercises_dir
from labtext import _


class HiddenChecksUnavailable(RuntimeError):
    """Hidden checks were asked for where they are not installed (a student's copy)."""


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and name.startswith(error.name):
            return None
        raise


def checks_in(module: ModuleType, hidden: bool = False) -> list[Check]:
    """Return the checks a module defines, in the order it defines them."""
    found = [v for v in vars(module).values() if isinstance(v, Check)]
    return [dataclasses.replace(c, hidden=True) for c in found] if hidden else found


def hidden_available(exercise: Exercise) -> bool:
    """Return True if the exercise's hidden checks are installed here."""
    return _module(exercise.hidden) is not None


def public_checks(exercise: Exercise) -> list[Check]:
    """Return the exercise's public checks."""
    public = _module(exercise.checks)
    if public is None:
        raise ModuleNotFoundError(
            _("the checks of {exercise}, {module}, are missing").format(
                exercise=exercise.id, module=exercise.checks
            )
        )
    return checks_in(public)


def hidden_checks(exercise: Exercise) -> list[Check]:
    """Return the exercise's hidden checks, or say that they are not installed here."""
    hidden = _module(exercise.hidden)
    if hidden is None:
        raise HiddenChecksUnavailable(
            _(
                "the hidden checks of {exercise} are not installed here; "
                "they exist only on the instructor's side"
            ).format(exercise=exercise.id)
        )
    return checks_in(hidden, hidden=True)


def exercise_checks(exercise: Exercise, include_hidden: bool) -> list[Check]:
    """Return the exercise's public checks, then its hidden ones if asked for."""
    return public_checks(exercise) + (hidden_checks(exercise) if include_hidden else [])


def exercise_points(exercise: Exercise) -> float:
    """Return an exercise's total: the points of its checks, with the hidden ones where they are
    at hand (the instructor's side). The manifest keeps no points of its own."""
    return sum(c.points for c in exercise_checks(exercise, hidden_available(exercise)))


def exercise_total(exercise: Exercise) -> float:
    """Return what an exercise is worth in all, here too where only its public checks are
    installed (a student's copy): there, the points of its released check cell, which
    `python -m grader sync` wrote from every check."""
    if hidden_available(exercise):
        return exercise_points(exercise)
    try:
        cell = cells_by_grade_id(exercises_dir() / exercise.notebook)[f"{exercise.id}-checks"]
        return float(cell["metadata"]["nbgrader"]["points"])
    except (OSError, KeyError, TypeError, ValueError):
        return exercise_points(exercise)


def assignment_points() -> float:
    """Return the points of the whole assignment: every exercise's (see `exercise_points`)."""
    from grader.manifest import load_manifest

    return sum(exercise_points(ex) for ex in load_manifest().exercises)


def narrowed(checks: list[Check], names: set[str] | None) -> list[Check]:
    """Return the checks named in `names` and those they must pass `after`, in their order
    (all of them when `names` is None): grading only these runs only their cases."""
    if names is None:
        return checks
    by_name = {c.name: c for c in checks}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise ValueError(
            _("no check called {names}; the checks are {checks}").format(
                names=", ".join(unknown), checks=sorted(by_name)
            )
        )
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += [n for n in by_name[name].after if n in by_name]
    return [c for c in checks if c.name in wanted]


def diagnoser(exercise: Exercise):
    """Return the exercise's function that turns an exception into a hint (or None)."""
    modules = [m for m in (_module(exercise.checks), _module(exercise.hidden)) if m is not None]
    found = [v for m in modules for v in vars(m).values() if isinstance(v, ErrorHints)]

    def diagnose(raised: Raised) -> str | None:
        for hints in found:
            if hint := hints.hint_for(raised):
                return hint
        return None

    return diagnose
