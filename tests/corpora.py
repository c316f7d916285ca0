"""The classes that several test modules read graded whole: the mistake catalogue, the hostile
class and the seeds. Each is graded once per run of the tests with the fast path (the
default) and once without it (GRADER_FAST=off), when a test first asks, whichever of make
test's workers that is; a worker that asks while the other grades waits for its report.

A class is written afresh for each of its two gradings, into a folder of the run's shared
temporary root (pytest's base folder, above each worker's own), and graded there with
`python -m grader grade --jobs 2`, writing a JSON report, a CSV and Gradescope's files."""

import contextlib
import fcntl
import functools
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from grader.exercises.catalogue import Mistake, mistakes_of
from grader.manifest import exercises_dir, load_manifest
from grader.tools.authoring import filled_in, reference_answers
from tests.conftest import python

MANIFEST = load_manifest()

# Each exercise's catalogued mistakes in order: student k makes the k-th of each exercise.
CATALOGUE: dict[str, list[tuple[str, Mistake]]] = {
    ex.id: list(mistakes_of(ex).items()) for ex in MANIFEST.exercises
}


@dataclass(frozen=True)
class Graded:
    """One grading of a class: where it lay, what the grader printed, and its reports."""

    classroom: Path
    out: Path
    returncode: int
    stdout: str
    stderr: str
    extra: dict

    @functools.cached_property
    def report(self) -> dict[str, dict]:
        """Each submission's JSON report by its id; the grading must have succeeded."""
        assert self.returncode == 0, self.stdout[-3000:] + self.stderr[-3000:]
        submissions = json.loads((self.out / "results.json").read_text())["submissions"]
        return {s["id"]: s for s in submissions}


# A class's writer: given the classroom and the reports' folder, it writes the class and
# stays open while the grader runs (the hostile class keeps a server listening), yielding a
# dict of what the tests need to know, which it may fill in once the grading is over.
Writer = Callable[[Path, Path], contextlib.AbstractContextManager[dict]]


@contextlib.contextmanager
def catalogue_class(classroom: Path, out: Path) -> Iterator[dict]:
    """Student k (catalogue01, ...) hands in every notebook with the k-th catalogued mistake
    of each exercise in its cell, the reference's answers everywhere else."""
    rounds = max(map(len, CATALOGUE.values()))
    for k in range(rounds):
        folder = classroom / catalogue_student(k) / MANIFEST.assignment
        folder.mkdir(parents=True)
        for notebook in MANIFEST.notebooks:
            answers = reference_answers(notebook)
            for ex in MANIFEST.in_notebook(notebook):
                if k < len(CATALOGUE[ex.id]):
                    answers[f"{ex.id}-solution"] = CATALOGUE[ex.id][k][1].source
            nb = filled_in(exercises_dir() / notebook, answers)
            (folder / notebook).write_text(json.dumps(nb), encoding="utf-8")
    yield {"rounds": rounds}


def catalogue_student(k: int) -> str:
    return f"catalogue{k + 1:02d}"


@contextlib.contextmanager
def hostile_class(classroom: Path, out: Path) -> Iterator[dict]:
    """tests/test_hostile.py's class, with a server counting the connections it gets."""
    from tests.test_hostile import Server, build_class

    server = Server()
    try:
        students = build_class(classroom, server.port, [out / "results.json", out / "grades.csv"])
        said = {"students": {name: str(folder) for name, folder in students.items()}}
        yield said
    finally:
        server.close()
    said["connections"] = server.connections


@contextlib.contextmanager
def seed_class(classroom: Path, out: Path) -> Iterator[dict]:
    """tests/test_seeds.py's class: each seed's functions moved into both releases."""
    from tests.test_seeds import SEEDS, write_seed_class

    if not SEEDS.is_dir():
        pytest.skip(f"the seed notes are not here ({SEEDS})")
    write_seed_class(classroom)
    yield {}


CORPORA: dict[str, Writer] = {
    "catalogue": catalogue_class,
    "hostile": hostile_class,
    "seeds": seed_class,
}


def graded(tmp_path_factory: pytest.TempPathFactory, corpus: str, fast: bool = True) -> Graded:
    """The corpus graded with the fast path or without it, graded now if no worker has yet."""
    return _graded(shared_root(tmp_path_factory), corpus, fast)


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's temporary folder that both workers see (each has its own below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@functools.cache
def _graded(root: Path, corpus: str, fast: bool) -> Graded:
    folder = root / f"corpus-{corpus}-{'fast' if fast else 'plain'}"
    record = folder / "record.json"
    with open(root / f"corpus-{corpus}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one grading of a corpus at a time, in any worker
        if not record.exists():
            _grade(folder, CORPORA[corpus], fast)
    said = json.loads(record.read_text())
    if said.get("skipped"):
        pytest.skip(said["skipped"])
    return Graded(
        classroom=folder / "class",
        out=folder / "out",
        returncode=said["returncode"],
        stdout=said["stdout"],
        stderr=said["stderr"],
        extra=said["extra"],
    )


def _grade(folder: Path, write: Writer, fast: bool) -> None:
    """Write the class under `folder`, grade it, and record how that went."""
    classroom, out = folder / "class", folder / "out"
    classroom.mkdir(parents=True)
    out.mkdir()
    record: dict = {}
    try:
        with write(classroom, out) as extra:
            done = subprocess.run(
                [
                    python(), "-m", "grader", "grade", str(classroom), "--jobs", "2",
                    "--json", str(out / "results.json"), "--csv", str(out / "grades.csv"),
                    "--gradescope", str(out / "gradescope"),
                ],
                capture_output=True, text=True, timeout=1800,
                env=dict(os.environ, GRADER_FAST="on" if fast else "off"),
            )  # fmt: skip
        record = {
            "returncode": done.returncode,
            "stdout": done.stdout,
            "stderr": done.stderr,
            "extra": extra,
        }
    except pytest.skip.Exception as skipped:
        record = {"skipped": str(skipped)}
    except subprocess.TimeoutExpired as late:
        record = {"returncode": -1, "stdout": "", "stderr": f"{late}", "extra": {}}
    (folder / "record.json").write_text(json.dumps(record))
