"""One mistake is charged once in the distributed and sharded notebooks, whose cases start
process groups.

tests/test_mistakes.py holds the exercises graded in this process to one lost check per
catalogued mistake; these exercises' cases fork ranks, so their catalogue is read from the
mistake catalogue graded as a class (tests/corpora.py, once in a run of the tests). Student k
holds the k-th mistake of each exercise in its cell, the reference's answers in the others:
the grader holds every other function right with the reference while an exercise's checks
run, so each exercise's checks see its own mistake alone.
"""

import pytest

from grader.exercises.catalogue import Mistake
from grader.manifest import load_manifest
from tests import corpora

pytestmark = pytest.mark.slow

MANIFEST = load_manifest()
NOTEBOOKS = ("distributed.ipynb", "sharded.ipynb")
EXERCISES = {nb: [ex for ex in MANIFEST.in_notebook(nb) if ex.distributed] for nb in NOTEBOOKS}
CATALOGUE = {ex.id: corpora.CATALOGUE[ex.id] for exs in EXERCISES.values() for ex in exs}
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
    """Each student's report by id, from the catalogue graded as a class."""
    return corpora.graded(tmp_path_factory, "catalogue").report


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
    sub = graded[corpora.catalogue_student(student)]
    (result,) = [e for e in sub["exercises"] if e["name"] == exercise]
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
