"""The real nbgrader workflow on a class, and its agreement with `python -m grader`.

Four students hand in the from-scratch notebook (tests/nbgrader_course.py takes them through
generate_assignment, autograde, generate_feedback, `python -m grader grade --gradebook` and
export): the stubs (bob), catalogued mistakes (carol), a correct submission whose functions
write warnings to stderr (dave), and stubs behind a cell that replaces `check` with a function
that claims every point (mallory). Autograde runs each notebook whole in the student's kernel,
training included, and runs the checks there, where mallory's cell fools it; the fenced scores
that the grader writes into the gradebook do not move. The reference answers in every notebook
go through the same workflow in tests/test_notebook_runs.py.
"""

import csv
import subprocess

import nbformat
import pytest

from grader.exercises.catalogue import mistakes_of
from grader.judge.registry import assignment_points
from grader.tools.authoring import filled_in, reference_answers
from tests.conftest import EXERCISES, SOLUTIONS, python
from tests.nbgrader_course import (
    ASSIGNMENT,
    MANIFEST,
    fenced_scores,
    gradebook_scores,
    run_course,
)

STUDENTS = ("bob", "carol", "dave", "mallory")
HONEST = ("bob", "carol", "dave")

FAKE_CHECK = """
import grader
from grader.judge.registry import exercise_points
from grader.manifest import load_manifest

def check(exercise_id, *args, **kwargs):
    return float(exercise_points(load_manifest().exercise(exercise_id)))

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


def mistake(exercise: str, name: str) -> str:
    return mistakes_of(MANIFEST.exercise(exercise))[name].source


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    reference = reference_answers("from_scratch.ipynb")
    submissions = {
        "bob": {"from_scratch.ipynb": {}},
        "carol": {
            "from_scratch.ipynb": {
                **reference,
                "allreduce-solution": mistake("allreduce", "rebinds_list_entries"),
                "train_loop-solution": mistake("train_loop", "swapped_loops"),
            },
        },
        "dave": {"from_scratch.ipynb": {**reference, "allreduce-solution": NOISY_ALLREDUCE}},
    }
    mallory = filled_in(EXERCISES / "from_scratch.ipynb", {})
    first_code = next(i for i, c in enumerate(mallory["cells"]) if c["cell_type"] == "code")
    mallory["cells"].insert(first_code + 1, nbformat.v4.new_code_cell(FAKE_CHECK))
    return run_course(course, submissions, {"mallory": {"from_scratch.ipynb": mallory}})


def test_autograde_agrees_with_the_grader_on_honest_notebooks(course):
    for student in HONEST:
        assert course.kernel[student] == fenced_scores(course, student), student


def test_the_gradebook_holds_the_fenced_scores(course):
    book = gradebook_scores(course.path, STUDENTS)
    for student in STUDENTS:
        assert book[student] == fenced_scores(course, student), student


def test_replacing_check_raises_no_score_in_the_gradebook(course):
    fooled = sum(course.kernel["mallory"].values())
    assert fooled > 0  # in her own kernel, the fake check claimed points
    assert course.graded["mallory"]["score"] == 0
    assert sum(gradebook_scores(course.path, ["mallory"])["mallory"].values()) == 0
    with (course.path / "grades.csv").open() as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
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


def test_the_stubs_get_nothing_in_both(course):
    with (course.path / "grades.csv").open() as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert float(rows["bob"]["score"]) == 0
    assert float(rows["bob"]["max_score"]) == assignment_points()
    assert course.graded["bob"]["score"] == 0
    assert sum(course.kernel["bob"].values()) == 0


def test_catalogued_mistakes_lose_their_points_in_both(course):
    carol = fenced_scores(course, "carol")
    assert carol["allreduce"] < 11 and carol["train_loop"] < 9
    assert carol["get_params"] == 11


def test_feedback_shows_the_hints(course):
    html = (course.path / "feedback" / "carol" / ASSIGNMENT / "from_scratch.html").read_text()
    assert "only makes the list point at a new tensor" in html
    assert "The loops are swapped" in html


def test_harmless_stderr_output_does_not_zero_a_correct_cell(course):
    assert course.kernel["dave"]["allreduce"] == 11
    assert fenced_scores(course, "dave")["allreduce"] == 11
