"""Read `manifest.toml`, the single list of exercises, and find the files it names."""

import difflib
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from grader import settings
from labtext import _

MANIFEST = Path(__file__).with_name("manifest.toml")
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Exercise:
    """One exercise: what the student writes, where, and what checks it."""

    id: str
    title: str
    notebook: str
    function: str
    trains: bool = False  # the function runs a whole training: loading never calls it
    distributed: bool = False  # its cases run in process groups (grader.ranks)

    @property
    def checks(self) -> str:
        """Return the module of its public checks, shipped to students."""
        return f"grader.exercises.{self.id}.checks"

    @property
    def hidden(self) -> str:
        """Return the module of its hidden checks, kept on the instructor's side."""
        return f"grader.exercises.{self.id}.private.hidden"

    @property
    def mistakes(self) -> str:
        """Return the module of its catalogue of known wrong implementations."""
        return f"grader.exercises.{self.id}.private.mistakes"


@dataclass(frozen=True)
class Manifest:
    """The assignment and its exercises, in teaching order."""

    assignment: str
    title: str
    exercises: tuple[Exercise, ...]

    def exercise(self, exercise_id: str) -> Exercise:
        """Return the exercise called `exercise_id`, or explain which ids exist."""
        for ex in self.exercises:
            if ex.id == exercise_id:
                return ex
        ids = [ex.id for ex in self.exercises]
        close = difflib.get_close_matches(str(exercise_id), ids, n=1, cutoff=0.75)
        if close:
            raise KeyError(
                _("no exercise called {id}: did you mean {close}?").format(
                    id=repr(exercise_id), close=repr(close[0])
                )
            )
        raise KeyError(
            _("no exercise called {id}; the exercises are: {ids}").format(
                id=repr(exercise_id), ids=", ".join(ids)
            )
        )

    @property
    def notebooks(self) -> list[str]:
        """Return the notebook names, in teaching order, each once."""
        return list(dict.fromkeys(ex.notebook for ex in self.exercises))

    def in_notebook(self, notebook: str) -> list[Exercise]:
        """Return the exercises that live in `notebook`."""
        return [ex for ex in self.exercises if ex.notebook == notebook]

    @property
    def private_packages(self) -> list[str]:
        """Return the packages that hold hidden checks and mistake catalogues, each once:
        the instructor's side, never shipped to students nor readable by a grading child."""
        names = [m.rpartition(".")[0] for ex in self.exercises for m in (ex.hidden, ex.mistakes)]
        return list(dict.fromkeys(names))

    def package_folder(self, package: str) -> Path:
        """Return the folder of a package of this repository, such as
        `grader.exercises.allreduce.private`."""
        return REPO.joinpath(*package.split("."))

    @property
    def training_functions(self) -> frozenset[str]:
        """Return the names of functions that train, which loading never calls."""
        return frozenset(ex.function for ex in self.exercises if ex.trains)


@cache
def load_manifest(path: Path = MANIFEST) -> Manifest:
    """Parse the manifest file."""
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    exercises = tuple(Exercise(**entry) for entry in raw["exercise"])
    ids = [ex.id for ex in exercises]
    if len(set(ids)) != len(ids):
        raise ValueError(
            _("{path}: exercise ids must be unique, got {ids}").format(path=path, ids=ids)
        )
    return Manifest(raw["assignment"]["id"], raw["assignment"]["title"], exercises)


def solutions_dir() -> Path:
    """Return the folder of reference notebooks (`$GRADER_SOLUTIONS`, else the repo's)."""
    default = REPO / "solutions" / load_manifest().assignment
    return Path(settings.SOLUTIONS.get() or default)


def exercises_dir() -> Path:
    """Return the folder of student notebooks as released."""
    return REPO / "exercises" / load_manifest().assignment
