"""The real nbgrader workflow on a temporary course, and its agreement with `python -m grader`.

generate_assignment -> submitted/ -> autograde -> generate_feedback
    -> python -m grader grade submitted --gradebook gradebook.db -> export

with five students: the reference (alice), the stubs (bob), catalogued mistakes (carol), a
correct submission whose functions write warnings to stderr (dave), and stubs behind a cell
that replaces `check` with a function that claims every point (mallory). Only alice hands in
every notebook; the others hand in the from-scratch notebook (autograde runs each notebook
whole in a kernel, training included; the other notebooks' stubs and mistakes are graded in
tests/test_notebook_runs.py and tests/test_mistakes.py). Autograde runs the checks inside each student's kernel,
where mallory's cell fools it; the fenced scores that the grader writes into the gradebook
do not move.
"""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grader.authoring import filled_in, reference_answers
from grader.manifest import REPO, load_manifest
from grader.mistakes import mistakes_of
from tests.conftest import SOLUTIONS, python

MANIFEST = load_manifest()
ASSIGNMENT = MANIFEST.assignment
STUDENTS = ("alice", "bob", "carol", "dave", "mallory")
HONEST = ("alice", "bob", "carol", "dave")
NBGRADER = str(Path(sys.executable).with_name("nbgrader"))

FAKE_CHECK = """
import grader
from grader.manifest import load_manifest

def check(exercise_id, *args, **kwargs):
    return float(load_manifest().exercise(exercise_id).points)

grader.check = check
"""

NOISY_ALLREDUCE = '''
import sys, warnings

def allreduce(data):
    """Sum the tensors in place, complaining on stderr as some libraries do."""
    warnings.warn("allreduce: this loop is slow", UserWarning)
    print("debug: summing", len(data), "tensors", file=sys.stderr)
    total = data[0]
    for other in data[1:]:
        total += other.to(total.device)
    for other in data[1:]:
        other.copy_(total)
'''

# Every test here starts graders or nbgrader.
pytestmark = pytest.mark.slow


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        DPLAB_DATA_SOURCE="sample",
        DPLAB_OFFLINE="1",
        MPLBACKEND="Agg",
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )  # nbgrader runs alembic
    proc = subprocess.run(
        [NBGRADER, *args], cwd=course, capture_output=True, text=True, timeout=1800, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def mistake(exercise: str, name: str) -> str:
    return mistakes_of(MANIFEST.exercise(exercise))[name].source


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    shutil.copy(REPO / "nbgrader_config.py", course)
    shutil.copytree(SOLUTIONS, course / "solutions" / ASSIGNMENT)
    nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    released = course / "exercises" / ASSIGNMENT
    submissions = {
        "alice": {nb: reference_answers(nb) for nb in MANIFEST.notebooks},
        "bob": {"from_scratch.ipynb": {}},
        "carol": {
            "from_scratch.ipynb": {
                **reference_answers("from_scratch.ipynb"),
                "allreduce-solution": mistake("allreduce", "rebinds_list_entries"),
                "train_loop-solution": mistake("train_loop", "swapped_loops"),
            },
        },
        "dave": {
            "from_scratch.ipynb": {
                **reference_answers("from_scratch.ipynb"),
                "allreduce-solution": NOISY_ALLREDUCE,
            }
        },
    }
    for student, notebooks in submissions.items():
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        for name, answers in notebooks.items():
            (folder / name).write_text(json.dumps(filled_in(released / name, answers)))
    mallory = filled_in(released / "from_scratch.ipynb", {})
    first_code = next(i for i, c in enumerate(mallory["cells"]) if c["cell_type"] == "code")
    mallory["cells"].insert(first_code + 1, nbformat.v4.new_code_cell(FAKE_CHECK))
    folder = course / "submitted" / "mallory" / ASSIGNMENT
    folder.mkdir(parents=True)
    (folder / "from_scratch.ipynb").write_text(json.dumps(mallory))
    nbgrader(course, "autograde", ASSIGNMENT, "--force")
    kernel = gradebook_scores(course)  # what the checks run in the students' kernels gave
    nbgrader(course, "generate_feedback", ASSIGNMENT, "--force")
    out = course / "grader.json"
    proc = subprocess.run(
        [
            python(),
            "-m",
            "grader",
            "grade",
            str(course / "submitted"),
            "--jobs",
            "2",
            "--json",
            str(out),
            "--gradebook",
            str(course / "gradebook.db"),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nbgrader(course, "export")
    graded = {s["id"]: s for s in json.loads(out.read_text())["submissions"]}
    return course, graded, kernel


def gradebook_scores(course: Path) -> dict[str, dict[str, float]]:
    """Return nbgrader's score of every exercise's check cell, per student."""
    from nbgrader.api import Gradebook

    scores: dict[str, dict[str, float]] = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for ex in MANIFEST.exercises:
            for student in STUDENTS:
                try:
                    grade = gb.find_grade(
                        f"{ex.id}-checks", Path(ex.notebook).stem, ASSIGNMENT, student
                    )
                    value = grade.score
                except Exception:  # the notebook was not submitted
                    value = 0.0
                scores.setdefault(student, {})[ex.id] = float(value)
    return scores


def test_autograde_agrees_with_the_grader_on_honest_notebooks(course):
    _, graded, kernel = course
    for student in HONEST:
        ours = {e["name"]: e["score"] for e in graded[student]["exercises"]}
        assert kernel[student] == ours, student


def test_the_gradebook_holds_the_fenced_scores(course):
    path, graded, _ = course
    book = gradebook_scores(path)
    for student in STUDENTS:
        ours = {e["name"]: e["score"] for e in graded[student]["exercises"]}
        assert book[student] == ours, student


def test_replacing_check_raises_no_score_in_the_gradebook(course):
    path, graded, kernel = course
    fooled = sum(kernel["mallory"].values())
    assert fooled > 0  # in her own kernel, the fake check claimed points
    assert graded["mallory"]["score"] == 0
    assert sum(gradebook_scores(path)["mallory"].values()) == 0
    rows = {row["student_id"]: row for row in csv.DictReader((path / "grades.csv").open())}
    assert float(rows["mallory"]["score"]) == 0


def test_a_gradebook_without_the_assignment_is_refused(tmp_path):
    proc = subprocess.run(
        [python(), "-m", "grader", "grade", str(SOLUTIONS), "--gradebook", str(tmp_path / "g.db")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert f"nbgrader generate_assignment {ASSIGNMENT}" in proc.stderr


def test_the_reference_gets_full_marks_and_the_stubs_none(course):
    path, graded, _ = course
    rows = {row["student_id"]: row for row in csv.DictReader((path / "grades.csv").open())}
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == MANIFEST.max_score
    assert float(rows["bob"]["score"]) == 0
    assert graded["alice"]["score"] == MANIFEST.max_score and graded["bob"]["score"] == 0


def test_catalogued_mistakes_lose_their_points_in_both(course):
    _, graded, _ = course
    carol = {e["name"]: e["score"] for e in graded["carol"]["exercises"]}
    assert carol["allreduce"] < 11 and carol["train_loop"] < 9
    assert carol["get_params"] == 11


def test_feedback_shows_the_hints(course):
    path, _, _ = course
    html = (path / "feedback" / "carol" / ASSIGNMENT / "from_scratch.html").read_text()
    assert "only makes the list point at a new tensor" in html
    assert "The loops are swapped" in html


def test_harmless_stderr_output_does_not_zero_a_correct_cell(course):
    _, graded, kernel = course
    assert kernel["dave"]["allreduce"] == 11
    dave = {e["name"]: e["score"] for e in graded["dave"]["exercises"]}
    assert dave["allreduce"] == 11
