"""The notebooks: exercises/ is exactly what nbgrader makes of solutions/, and they agree
with the manifest."""

import json
import subprocess
from pathlib import Path

import pytest

from grader.authoring import cells_by_grade_id, hidden_parts, problems
from grader.judge.registry import exercise_checks
from grader.manifest import REPO, load_manifest
from tests.conftest import EXERCISES, SOLUTIONS

MANIFEST = load_manifest()


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    release = tmp_path_factory.mktemp("release")
    nbgrader = Path(__import__("sys").executable).with_name("nbgrader")
    proc = subprocess.run(
        [
            str(nbgrader),
            "generate_assignment",
            MANIFEST.assignment,
            "--force",
            "--no-db",
            f"--CourseDirectory.release_directory={release}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return release / MANIFEST.assignment


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_exercises_are_what_nbgrader_makes_of_the_solutions(regenerated, notebook):
    committed = json.loads((EXERCISES / notebook).read_text())
    fresh = json.loads((regenerated / notebook).read_text())
    assert committed == fresh, (
        f"exercises/{MANIFEST.assignment}/{notebook} is out of date: run `make exercises`"
    )


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_released_notebooks_hold_no_solution_and_no_hidden_check(notebook):
    text = (EXERCISES / notebook).read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "hidden=True"):
        assert marker not in text
    released = [
        line.strip()
        for c in json.loads(text)["cells"]
        for line in "".join(c["source"]).splitlines()
    ]
    for ex in MANIFEST.in_notebook(notebook):
        answer = hidden_parts(notebook)[f"{ex.id}-solution"]
        for line in answer.splitlines():
            if len(line.strip()) > 12:
                assert line.strip() not in released, f"{ex.id}: the release shows {line.strip()!r}"


@pytest.mark.parametrize("folder", [SOLUTIONS, EXERCISES], ids=["solutions", "exercises"])
def test_notebooks_are_committed_without_outputs(folder):
    for notebook in MANIFEST.notebooks:
        for cell in json.loads((folder / notebook).read_text())["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, notebook


def test_reference_notebooks_agree_with_the_manifest():
    assert problems() == []


def test_each_exercise_has_its_cells_in_its_notebook():
    for ex in MANIFEST.exercises:
        cells = cells_by_grade_id(SOLUTIONS / ex.notebook)
        solution = "".join(cells[f"{ex.id}-solution"]["source"])
        assert f"def {ex.function}(" in solution
        check_cell = "".join(cells[f"{ex.id}-checks"]["source"])
        assert f'check("{ex.id}", {ex.function})' in check_cell


def test_manifest_points_are_the_sum_of_the_checks():
    for ex in MANIFEST.exercises:
        checks = exercise_checks(ex, include_hidden=True)
        assert sum(c.points for c in checks) == ex.points, ex.id


def test_every_check_says_what_it_proves_and_how_to_fix_it():
    for ex in MANIFEST.exercises:
        names = [c.name for c in exercise_checks(ex, include_hidden=True)]
        assert len(names) == len(set(names)), f"{ex.id} has two checks of the same name"
        for c in exercise_checks(ex, include_hidden=True):
            assert c.doc, f"{ex.id}.{c.name} has no docstring"
            assert len(c.hint) > 20, f"{ex.id}.{c.name} has no real hint"
            assert c.points > 0
            for before in c.after:
                assert before in names[: names.index(c.name)], f"{c.name} waits on a later check"


def test_readme_lists_the_exercises_from_the_manifest():
    from grader.cli import exercise_table

    assert exercise_table() in (REPO / "README.md").read_text()
