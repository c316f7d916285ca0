"""Fixtures for the lab's own tests."""

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from dplab import sim
from dplab.devices import remove_cuda_shims
from grader.api import Context, Student
from grader.base.grading_devices import grading_devices
from grader.base.results import ExerciseResult
from grader.grading import DEVICES, grade_path
from grader.judge.registry import diagnoser, exercise_checks, narrowed
from grader.judge.verdicts import Verdict, judge_exercise, judge_verdicts
from grader.load.notebook import load_notebook, read_cells
from grader.load.reference import reference
from grader.load.runner import run_checks
from grader.manifest import REPO, Exercise, load_manifest
from grader.ranks.apart import autograd_threads_started
from tests import durations, skips
from tests.skips import (  # noqa: F401  pytest's hooks: mendable skips fail on CI
    pytest_runtest_makereport,
    pytest_unconfigure,
)

# The tests never download anything and never open a window.
os.environ["DPLAB_OFFLINE"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")

SOLUTIONS = REPO / "solutions" / load_manifest().assignment
# Notebooks run whole in the tests train on the first images of the embedded sample only: the
# tests judge that training runs on every device and prints the book's lines, not how well it
# learns, and the sample's 4,000 images made the final training calls most of the suite's time.
NOTEBOOK_DATA_LIMIT = "512,256"
EXERCISES = REPO / "exercises" / load_manifest().assignment


# Fixtures that grade a class, run nbgrader, a notebook in a kernel or JupyterLab: a test that
# uses one is slow (`make test-quick` leaves it out), like a test marked so by hand.
SLOW_FIXTURES = {
    "checkout",
    "concise",
    "course",
    "distributed",
    "distributed_class",
    "exported",
    "graded",
    "lab",
    "on_stand_ins",
    "on_the_cpu",
    "regenerated",
    "report",
    "scratch",
    "sharded",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

    # Modules in the order of their recorded seconds, longest first (tests/durations.py).
    seconds = durations.recorded()
    items.sort(key=lambda item: -seconds.get(Path(str(item.fspath)).stem, float("inf")))


def pytest_runtest_logreport(report):
    skips.pytest_runtest_logreport(report)
    if _reporting:
        durations.add(report)


_reporting: list[bool] = []  # (true in the process that reports, not in xdist's workers)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        _reporting.append(True)


def pytest_sessionfinish(session):
    path = session.config.getoption("record_durations")
    if path and _reporting:
        durations.write(path)


@pytest.fixture(scope="session")
def manifest():
    return load_manifest()


@pytest.fixture(autouse=True)
def _figures_in_tmp(tmp_path, monkeypatch):
    """Plots saved by headless Animators land in the test's own folder."""
    monkeypatch.setenv("DPLAB_FIGURE_DIR", str(tmp_path))


@pytest.fixture
def stand_ins():
    """Four stand-in devices for the test, switched off after it."""
    sim.enable(4)
    yield [torch.device("sim", i) for i in range(4)]
    sim.disable()
    remove_cuda_shims()


@pytest.fixture(autouse=True, scope="module")
def _no_stand_ins_after_a_module():
    """Whatever switched stand-ins on in a module (the lab's own code does, when it hands
    them out), they are off before the next module: no test relies on another's."""
    yield
    sim.disable()
    remove_cuda_shims()


def fresh_solution(notebook: str) -> dict:
    """Load a reference notebook into a new namespace (skipping its training calls)."""
    return load_notebook(
        SOLUTIONS / notebook,
        load_manifest().training_functions,
        module_name=f"test_{Path(notebook).stem}",
    ).namespace


def grade_in_process(
    ex: Exercise, namespace: dict, seed: int = 0, only: set[str] | None = None
) -> ExerciseResult:
    """Run an exercise's public and hidden checks (or the `only` ones, and those they come
    after) on a namespace, in this process."""
    checks = narrowed(exercise_checks(ex, include_hidden=True), only)
    known = reference(ex.notebook)
    ctx = Context(seed, grading_devices(DEVICES), known)
    outcomes = run_checks(checks, Student(namespace, ex.function, ex.notebook), ctx, held=known)
    return judge_exercise(ex.id, ex.function, checks, outcomes, ctx, diagnoser(ex))


def verdicts_of_source(ex: Exercise, source: str, seed: int = 0) -> list[Verdict]:
    """Return the verdict on every check of an exercise, public and hidden, of the reference
    notebook with `source` run after its cells (in this process: not for the exercises whose
    cases start process groups)."""
    namespace = fresh_solution(ex.notebook)
    exec(compile(source, f"<variant of {ex.id}>", "exec"), namespace)
    checks = exercise_checks(ex, include_hidden=True)
    known = reference(ex.notebook)
    ctx = Context(seed, grading_devices(DEVICES), known)
    outcomes = run_checks(checks, Student(namespace, ex.function, ex.notebook), ctx, held=known)
    return judge_verdicts(ex.function, checks, outcomes, ctx, diagnoser(ex))


def grade_source(
    ex: Exercise, source: str, seed: int = 0, only: set[str] | None = None
) -> ExerciseResult:
    """Grade an exercise of the reference notebook with `source` run after its cells (a
    catalogued mistake, say), on all its checks or the `only` ones. In this process, as
    `grade_in_process`, unless the exercise's checks start process groups and this process
    can no longer fork ranks that run backward (autograd's threads, started by earlier tests
    on stand-ins): then the grader grades the notebook in a fenced child of its fork server,
    as it grades a class."""
    if ex.distributed and autograd_threads_started():
        with tempfile.TemporaryDirectory(prefix="variant-") as tmp:
            folder = Path(tmp) / "variant" / load_manifest().assignment
            write_notebook(folder / ex.notebook, *read_cells(SOLUTIONS / ex.notebook), source)
            (result,) = grade_path(folder, [ex.id], seed=seed, only_checks=only).exercises
            return result
    namespace = fresh_solution(ex.notebook)
    exec(compile(source, f"<variant of {ex.id}>", "exec"), namespace)
    return grade_in_process(ex, namespace, seed, only)


def hidden_checks_file(exercise: str = "allreduce") -> Path:
    """Return the file of an exercise's hidden checks, which must be there: a test that tries
    to read a file that does not exist proves nothing about the fence."""
    path = REPO / "grader" / "exercises" / exercise / "private" / "hidden.py"
    assert path.is_file(), f"{path} is missing: the test would read nothing"
    return path


def python() -> str:
    """Return the interpreter running the tests (the project's virtual environment)."""
    return sys.executable


def write_notebook(path: Path, *cells: str) -> Path:
    """Write a notebook whose code cells are `cells` (a cell starting with '#md' is Markdown)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    for source in cells:
        if source.startswith("#md"):
            nb.cells.append(nbformat.v4.new_markdown_cell(source[3:].strip()))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(source.strip("\n")))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def notebook_from_script(script: Path, target: Path) -> Path:
    """Write the percent-format `script` as a notebook at `target`: `# %%` starts a code
    cell, `# %% [markdown]` a Markdown cell (its lines without the leading `# `); what comes
    before the first marker is a note for the reader and is left out."""
    cells: list[str] = []
    kind = ""
    for line in script.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            kind = "markdown" if "[markdown]" in line else "code"
            cells.append("#md " if kind == "markdown" else "")
        elif kind == "markdown":
            cells[-1] += line.removeprefix("#").removeprefix(" ") + "\n"
        elif kind == "code":
            cells[-1] += line + "\n"
    return write_notebook(target, *(c.rstrip("\n") for c in cells))


def note_texts(submission: dict) -> list[str]:
    """Return a submission's notes from its JSON report as the report says them: each with
    its notebook before its text, where it names one."""
    return [
        f"{n['notebook']}: {n['text']}" if n["notebook"] else n["text"] for n in submission["notes"]
    ]
