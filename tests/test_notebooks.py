"""The notebooks: exercises/ is exactly what nbgrader makes of solutions/, and they agree
with the manifest."""

import json
import subprocess
from pathlib import Path

import pytest

from grader.judge.registry import exercise_checks, exercise_points
from grader.manifest import REPO, load_manifest
from grader.tools.authoring import cells_by_grade_id, hidden_parts, manifest_problems
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
    assert manifest_problems() == []


def test_each_exercise_has_its_cells_in_its_notebook():
    for ex in MANIFEST.exercises:
        cells = cells_by_grade_id(SOLUTIONS / ex.notebook)
        solution = "".join(cells[f"{ex.id}-solution"]["source"])
        # the function the exercise asks for, or its class (ShardedOptimizer)
        assert f"def {ex.function}(" in solution or f"class {ex.function}" in solution
        check_cell = "".join(cells[f"{ex.id}-checks"]["source"])
        assert f'check("{ex.id}", {ex.function})' in check_cell


def test_an_exercise_is_worth_the_points_of_its_checks():
    """The manifest keeps no points of its own: an exercise is worth its checks', public and
    hidden (and its check cell says so: see test_reference_notebooks_agree_with_the_manifest)."""
    import tomllib

    from grader.manifest import MANIFEST as MANIFEST_FILE

    raw = tomllib.loads(MANIFEST_FILE.read_text(encoding="utf-8"))
    assert raw["exercise"] and not any("points" in entry for entry in raw["exercise"])
    for ex in MANIFEST.exercises:
        checks = exercise_checks(ex, include_hidden=True)
        assert checks and sum(c.points for c in checks) == exercise_points(ex), ex.id


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


def test_every_check_names_its_property_and_how_it_compares():
    """Each check's docstring ends with `Property: ...;` and either `against the reference`
    or `a relation`, for the maintainer (docs/grading.md); the student reads what comes before
    it. No property of an exercise is compared with the reference by two checks."""
    unsaid = []
    for ex in MANIFEST.exercises:
        compared: dict[str, str] = {}
        for c in exercise_checks(ex, include_hidden=True):
            prop, _, how = c.judged.removeprefix("Property:").partition(";")
            if not c.judged or not how.strip().startswith(("against the reference", "a relation")):
                unsaid.append(f"{ex.id}.{c.name}")
                continue
            if how.strip().startswith("against the reference"):
                key = prop.strip().lower()
                assert key not in compared, (
                    f"{ex.id}: {c.name} and {compared.get(key)} both compare {key!r} with the "
                    "reference"
                )
                compared[key] = c.name
            assert "Property:" not in c.doc
    assert not unsaid, f"checks that do not say what they prove and how: {unsaid}"


def test_every_gate_says_in_one_line_why_its_check_cannot_judge_without_it():
    """A check may wait on another (`after=`) only where it cannot observe its property
    unless that one passes; the reason (`because=`) is shown to the student with the gate."""
    for ex in MANIFEST.exercises:
        for c in exercise_checks(ex, include_hidden=True):
            if c.after:
                assert c.because, f"{ex.id}.{c.name} waits on {c.after} and says not why"
                assert "\n" not in c.because and len(c.because) <= 100, c.because
            else:
                assert not c.because, f"{ex.id}.{c.name} gives a reason for no gate"


def test_readme_lists_the_exercises_from_the_manifest():
    from grader.front.cli import exercise_table

    assert exercise_table() in (REPO / "README.md").read_text()


# ---- the lab's cells leave the student's names alone ---------------------------------------

# Helpers the lab's own cells define after an exercise cell although a student might define
# them too: the book's `lenet`, which the from-scratch exercises call, and the network that
# `torchrun -m dplab.train_ddp` loads from the distributed notebook by that name.
LAB_NAMES = {"from_scratch.ipynb": {"lenet"}, "distributed.ipynb": {"lenet"}}
OUTSIDE = REPO / "tests" / "outside"


def helpers_defined(source: str) -> set[str]:
    """Return the helpers a cell defines at its top level: functions, classes and imported
    names, what a function of the cell may call (its demo variables are left out: a lab's demo
    that rebinds the book's `data` gives it the same meaning)."""
    import ast

    from dplab.notebook import strip_magics

    code, _note = strip_magics(source)
    names = set()
    for statement in ast.parse(code).body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in statement.names}
    return names


def students_names(notebook: str) -> set[str]:
    """Return the helpers a student's cells may define: the book's (students copy d2l's code
    into their cells), those of the reference's exercise cells, and, in the outside-style
    submissions of tests/outside/ (written in real habits), what the exercise cells define and
    the helpers of other cells that they call (such as the `accuracy(output, target, topk)`
    of PyTorch's ImageNet example)."""
    import dplab

    names = set(dplab.__all__)
    cells = cells_by_grade_id(SOLUTIONS / notebook)
    for ex in MANIFEST.in_notebook(notebook):
        names |= helpers_defined("".join(cells[f"{ex.id}-solution"]["source"]))
    functions = {ex.function for ex in MANIFEST.in_notebook(notebook)}
    for script in OUTSIDE.glob(f"*/{notebook.replace('.ipynb', '.py')}"):
        cells = [c.partition("\n")[2] for c in script.read_text(encoding="utf-8").split("# %%")]
        exercises = [c for c in cells[1:] if helpers_defined(c) & functions]
        called = set().union(*(names_used(c) for c in exercises))
        for cell in cells[1:]:
            defined = helpers_defined(cell)
            names |= defined if cell in exercises else defined & called
    return names


def names_used(source: str) -> set[str]:
    """Return the names a cell's code reads."""
    import ast

    tree = ast.parse(source)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_no_cell_of_the_lab_rebinds_a_helper_a_students_cell_may_define(notebook):
    """Loading a whole notebook must not replace a student's helper: a later cell of the lab
    that defines the same name (as section 7's `accuracy` did) leaves the student's function
    calling the lab's."""
    theirs = students_names(notebook) - LAB_NAMES.get(notebook, set())
    seen_an_exercise = False
    for cell in json.loads((SOLUTIONS / notebook).read_text())["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        if cell["cell_type"] != "code" or grade_id.endswith("-checks"):
            continue
        if grade_id.endswith("-solution"):
            seen_an_exercise = True
        elif seen_an_exercise:
            clash = helpers_defined("".join(cell["source"])) & theirs
            assert not clash, f"{notebook}, cell {cell['id']}: the lab's cell redefines {clash}"


def possible_values(node) -> list[str]:
    """Return the strings an expression may give: a constant, or either side of `a if c else b`
    (None and names give none)."""
    import ast

    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.IfExp):
        return possible_values(node.body) + possible_values(node.orelse)
    return []


def test_every_see_names_a_check_of_the_same_exercise():
    """A failure that names the check owning its cause (`see=`) must name one that exists,
    or its points would never come back."""
    import ast
    import importlib

    for ex in MANIFEST.exercises:
        names = {c.name for c in exercise_checks(ex, include_hidden=True)}
        for module in (ex.checks, ex.hidden):
            tree = ast.parse(Path(importlib.import_module(module).__file__).read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.keyword) and node.arg == "see":
                    for value in possible_values(node.value):
                        assert value in names, f"{module}: see={value!r}"
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id.endswith("_OWNER") for t in node.targets
                ):
                    assert node.value.value in names, f"{module}: {ast.unparse(node)}"
