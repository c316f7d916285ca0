"""A temporary nbgrader course, taken through the instructor's whole workflow.

generate_assignment -> submitted/ -> autograde -> generate_feedback
    -> python -m grader grade submitted --gradebook gradebook.db -> export

`run_course` returns the course folder, the grader's report per student, and what the check
cells gave in each student's own kernel (nbgrader's scores before the grader writes its own).
"""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader.manifest import REPO, load_manifest
from grader.tools.authoring import filled_in
from tests.conftest import NOTEBOOK_DATA_LIMIT, SOLUTIONS, python

MANIFEST = load_manifest()
ASSIGNMENT = MANIFEST.assignment
NBGRADER = str(Path(sys.executable).with_name("nbgrader"))
STAND_INS = 4  # more than the book's two, to show that nothing assumes two


@dataclass
class Course:
    path: Path
    graded: dict[str, dict]  # the grader's report, per student
    kernel: dict[str, dict[str, float]]  # the check cells' scores in the students' kernels

    def autograded(self, student: str, notebook: str) -> nbformat.NotebookNode:
        """Return the notebook as autograde ran it, outputs included."""
        return nbformat.read(self.path / "autograded" / student / ASSIGNMENT / notebook, 4)


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        DPLAB_DATA_SOURCE="sample",
        DPLAB_DATA_LIMIT=NOTEBOOK_DATA_LIMIT,
        DPLAB_OFFLINE="1",
        DPLAB_STAND_INS=str(STAND_INS),
        DPLAB_FIGURE_DIR=str(course / "figures"),
        MPLBACKEND="Agg",
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )  # nbgrader runs alembic
    proc = subprocess.run(
        [NBGRADER, *args], cwd=course, capture_output=True, text=True, timeout=1800, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def gradebook_scores(course: Path, students) -> dict[str, dict[str, float]]:
    """Return nbgrader's score of every exercise's check cell, per student."""
    from nbgrader.api import Gradebook

    scores: dict[str, dict[str, float]] = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for ex in MANIFEST.exercises:
            for student in students:
                try:
                    grade = gb.find_grade(
                        f"{ex.id}-checks", Path(ex.notebook).stem, ASSIGNMENT, student
                    )
                    value = grade.score
                except Exception:  # the notebook was not submitted
                    value = 0.0
                scores.setdefault(student, {})[ex.id] = float(value)
    return scores


def run_course(
    course: Path,
    submissions: dict[str, dict[str, dict[str, str]]],
    extra: dict | None = None,
    feedback: bool = True,
) -> Course:
    """Take `submissions` ({student: {notebook: {cell id: source}}}, answers filled into the
    released notebooks) and `extra` ({student: {notebook: notebook as JSON}}) through the
    workflow (without generate_feedback if `feedback` is False)."""
    shutil.copy(REPO / "nbgrader_config.py", course)
    shutil.copytree(SOLUTIONS, course / "solutions" / ASSIGNMENT)
    nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    released = course / "exercises" / ASSIGNMENT
    handed_in = {
        student: {name: filled_in(released / name, answers) for name, answers in nbs.items()}
        for student, nbs in submissions.items()
    }
    for student, notebooks in {**handed_in, **(extra or {})}.items():
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        for name, nb in notebooks.items():
            (folder / name).write_text(json.dumps(nb))
    students = sorted({*submissions, *(extra or {})})
    nbgrader(course, "autograde", ASSIGNMENT, "--force")
    kernel = gradebook_scores(course, students)
    if feedback:
        nbgrader(course, "generate_feedback", ASSIGNMENT, "--force")
    out = course / "grader.json"
    proc = subprocess.run(
        [
            *(python(), "-m", "grader", "grade", str(course / "submitted")),
            *("--jobs", "2", "--json", str(out), "--gradebook", str(course / "gradebook.db")),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nbgrader(course, "export")
    graded = {s["id"]: s for s in json.loads(out.read_text())["submissions"]}
    return Course(course, graded, kernel)


def fenced_scores(course: Course, student: str) -> dict[str, float]:
    return {e["name"]: e["score"] for e in course.graded[student]["exercises"]}
