"""The reference solutions, on the instructor's side: loaded whole for the hidden checks, and
in parts for the names a case holds right.

A case that calls the student's `train_batch` also calls, through it, the student's
`split_batch` and `allreduce`. To judge `train_batch` alone, the case *holds* those names:
they are the reference's while it runs. In the grading child the reference must not be
there before the exercises it holds have been judged, so the child asks for it when it
reaches such a case, and gets only what that case holds (`held_sources`): the notebook's
set-up cells (imports and definitions such as `lenet` and `loss`) and the solution cells
of the held functions. Where there is no reference (a student's copy of the lab), nothing
is held and the student's own functions run.
"""

import ast
import threading
from functools import cache
from pathlib import Path

from grader.load.notebook import cells_by_grade_id, load_cells, read_cells
from grader.manifest import load_manifest, solutions_dir
from labtext import _

_lock = threading.Lock()


def available(notebook: str) -> bool:
    """Return True if the reference solution of `notebook` is installed here."""
    return (solutions_dir() / notebook).is_file()


@cache
def _load(notebook: str) -> dict:
    path = solutions_dir() / notebook
    if not path.is_file():
        raise FileNotFoundError(
            _("the reference solution {path} is missing; hidden checks need it").format(path=path)
        )
    manifest = load_manifest()
    functions = [ex.function for ex in manifest.in_notebook(notebook)]
    return load_cells(
        held_sources(notebook, functions),
        path,
        manifest.training_functions,
        module_name=f"reference_{Path(notebook).stem}",
        kind="reference",  # not "code": reports never quote the reference's lines
    ).namespace


def reference(notebook: str) -> dict:
    """Return the names defined by the reference solution of `notebook` (instructor side):
    its set-up cells and its solution cells, run in order. Its demos (loading the data,
    printing, plotting) are left out: no check needs them, and they would cost a second."""
    with _lock:
        return _load(notebook)


def reference_if_available(notebook: str) -> dict | None:
    """Return the reference's names where the reference is installed, else None."""
    return reference(notebook) if available(notebook) else None


def is_setup(source: str) -> bool:
    """Return True for a cell that only imports and defines (no demo, no printing)."""
    kept = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%"))
    try:
        tree = ast.parse(kept)
    except SyntaxError:
        return False
    allowed = ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef | ast.Assign
    return bool(tree.body) and all(isinstance(node, allowed) for node in tree.body)


def names_used(source: str) -> set[str]:
    """Return the names a cell's code reads."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def held_sources(notebook: str, names: tuple[str, ...] | list[str]) -> list[str]:
    """Return the reference cells that define what a case holding `names` needs: the set-up
    cells, and the solution cells of the exercises whose functions are in `names` or are
    called by those (the reference `train_batch` calls the reference `allreduce`)."""
    path = solutions_dir() / notebook
    cells = cells_by_grade_id(path)
    solution_of = {
        ex.function: "".join(cells[f"{ex.id}-solution"]["source"])
        for ex in load_manifest().in_notebook(notebook)
        if f"{ex.id}-solution" in cells
    }
    needed = {n for n in names if n in solution_of}
    while True:
        more = {n for f in needed for n in names_used(solution_of[f]) if n in solution_of}
        if more <= needed:
            break
        needed |= more
    solutions = {solution_of[f] for f in needed}
    graded = {"".join(cell["source"]) for cell in cells.values()}
    return [
        source
        for source in read_cells(path)
        if source in solutions or (source not in graded and is_setup(source))
    ]
