"""One mistake is charged once in the distributed and sharded notebooks, whose cases start
process groups.

tests/test_mistakes.py holds the exercises graded in this process to one lost check per
catalogued mistake; these exercises' cases fork ranks, so their catalogue is graded here as a
class, in one run of `python -m grader grade`, and the reports are read. Submission k holds
the k-th mistake of each exercise (the reference's cells, then each mistake's function): the
grader holds every other function right with the reference while an exercise's checks run, so
each exercise's checks see its own mistake alone.
"""

import json
import subprocess

import pytest

from grader.exercises.catalogue import Mistake, mistakes_of
from grader.manifest import load_manifest
from tests.conftest import python, write_notebook
from tests.test_hostile import sources

pytestmark = pytest.mark.slow

MANIFEST = load_manifest()
NOTEBOOKS = ("distributed.ipynb", "sharded.ipynb")
EXERCISES = {nb: [ex for ex in MANIFEST.in_notebook(nb) if ex.distributed] for nb in NOTEBOOKS}
CATALOGUE = {ex.id: sorted(mistakes_of(ex).items()) for exs in EXERCISES.values() for ex in exs}
# What a check that saw nothing to judge says (a gate not passed, every call raised): it
# fails without charging (grader.judge.verdicts); so does one whose ranks never finished
# where another check charges for that (its `kept_for`).
UNOBSERVED = ("not judged", "could not judge this")


def mistake_of(exercise: str, student: int) -> tuple[str, Mistake] | None:
    """Return the catalogued mistake (its name and itself) that student `student` makes in
    `exercise`, or None when the catalogue has fewer."""
    mistakes = CATALOGUE[exercise]
    return mistakes[student] if student < len(mistakes) else None


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade each notebook's class of catalogued mistakes once, when first asked; return a
    function of the notebook that gives each student's report by id."""
    done: dict[str, dict[str, dict]] = {}

    def reports(notebook: str) -> dict[str, dict]:
        if notebook not in done:
            done[notebook] = grade_class(tmp_path_factory.mktemp("charged-once"), notebook)
        return done[notebook]

    return reports


def grade_class(root, notebook: str) -> dict[str, dict]:
    """Grade `notebook`'s class of catalogued mistakes in one run; each report by id."""
    exercises = EXERCISES[notebook]
    for k in range(max(len(CATALOGUE[ex.id]) for ex in exercises)):
        made = [mistake_of(ex.id, k) for ex in exercises]
        cells = [*sources(notebook), *(m.source for _, m in filter(None, made))]
        write_notebook(root / "submitted" / f"student{k}" / MANIFEST.assignment / notebook, *cells)
    out = root / "results.json"
    proc = subprocess.run(
        [
            python(), "-m", "grader", "grade", str(root / "submitted"), "--jobs", "2",
            "--json", str(out), *(a for ex in exercises for a in ("--exercise", ex.id)),
        ],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {s["id"]: s for s in json.loads(out.read_text())["submissions"]}


CASES = [
    pytest.param(
        nb, ex.id, k, id=f"{ex.id}::{mistake_of(ex.id, k)[0]}", marks=getattr(pytest.mark, ex.id)
    )
    for nb, exercises in EXERCISES.items()
    for ex in exercises
    for k in range(len(CATALOGUE[ex.id]))
]


@pytest.mark.parametrize(("notebook", "exercise", "student"), CASES)
def test_one_mistake_is_charged_once_in_a_process_group(graded, notebook, exercise, student):
    """Graded as a class on every check of its exercise, hidden ones included, a catalogued
    mistake loses the points of its own check and of no other, but for the checks it names in
    `also`; a check that saw nothing to judge says so and charges nothing."""
    name, mistake = mistake_of(exercise, student)
    reports = graded(notebook)
    (result,) = [e for e in reports[f"student{student}"]["exercises"] if e["name"] == exercise]
    checks = {c["name"]: c for c in result["checks"]}
    assert set(mistake.also) <= set(checks), f"{name}: `also` names a check {exercise} lacks"
    assert not checks[mistake.fails]["passed"], f"{name} passed {mistake.fails}"
    charged = {
        c["name"]: c["message"]
        for c in result["checks"]
        if c["points"] < c["max_points"]
        and not c["message"].startswith(UNOBSERVED)
        and not c.get("kept_for")  # its ranks never finished: it could not judge
    }
    allowed = {mistake.fails, *mistake.also}
    assert set(charged) <= allowed, {k: m for k, m in charged.items() if k not in allowed}
    for check in mistake.also:
        assert check in charged, f"{name} no longer costs {check}: take it out of `also`"
