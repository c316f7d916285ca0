"""Turn a notebook into a namespace of the student's definitions, without running its training.

Loading runs the notebook's code cells top to bottom, one top-level statement at a time:
- a statement that fails (a broken demo, a missing GPU) is noted and loading goes on, so
  one mistake never costs the student the other exercises;
- a statement that calls a training function (`train(num_gpus=2, ...)`) is skipped: the
  checks call those functions themselves, on tiny data; so is a check cell (`check(...)`),
  and so is any statement that launches processes (`d2l.launch(...)`, however deep in a
  helper function: the launch raises LaunchSkipped and the statement ends there);
- IPython magics (`%matplotlib inline`, `!pip ...`) are dropped;
- `from d2l import torch as d2l` gives the lab's `dplab`, so book-style code loads
  without the `d2l` package and every submission sees the same helpers;
- `from matplotlib import pyplot as plt` gives pyplot as a module that loads when first
  used (`imported_when_used`): only a notebook that draws pays for importing it.
"""

import ast
import contextlib
import importlib.abc
import importlib.util
import io
import json
import linecache
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from pathlib import Path

from dplab.launched import LaunchSkipped, launches_skipped
from dplab.notebook import (  # (a loader's reading rules are the runtime's)
    NEVER_CALLED,
    calls_any,
    install_d2l_alias,
    named_cells,
)
from dplab.notebook import (
    NotebookError as NotebookError,
)
from dplab.notebook import (
    read_cells as read_cells,
)
from dplab.notebook import (
    strip_magics as strip_magics,
)
from grader.base.printed import captured
from grader.base.protocol import CellRef, Note
from grader.base.time_limit import TimeLimit, time_limit
from labtext import N_, _

# What a notebook imports only to draw: where not yet imported, it loads when first used
# (importlib's LazyLoader). matplotlib.pyplot takes 0.2 to 0.5 s to import, and neither
# the checks nor the grader's process draw; a notebook that draws at load pays for it then.
WHEN_USED = ("matplotlib.pyplot",)


class _WhenUsed(importlib.abc.MetaPathFinder):
    """Finds the modules in `names` as Python would, to be loaded when first used."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    if hasattr(spec.loader, "exec_module"):
                        spec.loader = importlib.util.LazyLoader(spec.loader)
                    return spec
        return None


@contextlib.contextmanager
def imported_when_used(names: tuple[str, ...] = WHEN_USED) -> Iterator[None]:
    """While the block runs, importing one of `names` (not yet imported) gives a module that
    runs its code when first used."""
    finder = _WhenUsed(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


# A code cell's name as a note says it, in the reader's language (grader.base.protocol.CellRef
# has it in English, as the code's file name holds it).
CELL = N_("cell {label}")  # a cell named by its grade id or its first line, in backticks
CELL_DEFINING = N_("cell that defines {name}")  # a cell named by what it defines
CELL_NAMES = {
    "empty": N_("cell number {number} (empty)"),
    "code": N_("code cell {number}"),
    "reference": N_("reference cell {number}"),
}


def said_cell(cell: CellRef) -> str:
    """Return a code cell's name (see CellRef) in the reader's language."""
    if cell.kind == "defines":
        return _(CELL_DEFINING).format(name=f"`{cell.name}`")
    if cell.kind in CELL_NAMES:
        return _(CELL_NAMES[cell.kind]).format(number=cell.number)
    return _(CELL).format(label=f"`{cell.name}`")


def cell_refs(path: Path) -> list[tuple[str, CellRef]]:
    """Return (source, CellRef) for each of the notebook's code cells."""
    cells = named_cells(path)
    return [(source, CellRef(kind, name, n)) for n, (source, kind, name) in enumerate(cells, 1)]


@dataclass
class Loaded:
    """What loading a notebook gave: the student's namespace and what happened on the way."""

    path: Path
    namespace: dict
    notes: list[Note] = field(default_factory=list)


def load_notebook(
    path: str | Path,
    skip_calls: frozenset[str] = frozenset(),
    module_name: str | None = None,
    statement_seconds: float | None = None,
    skip_statements: frozenset[tuple[int, int]] = frozenset(),
    before_statement: Callable[[int, int], None] | None = None,
    kind: str = "code",
) -> Loaded:
    """Run the notebook's definitions into a fresh module namespace; see the module docstring.

    `statement_seconds` limits each top-level statement (None: no limit); the statements at
    `skip_statements` (code cell, line) are not run; `before_statement(cell, line)` is
    called before each statement runs.
    """
    path = Path(path)
    name = module_name or f"submission_{path.stem.replace('-', '_')}"
    cells = cell_refs(path)
    return load_cells(
        [source for source, _ in cells],
        path,
        skip_calls,
        name,
        statement_seconds,
        skip_statements,
        before_statement,
        kind,
        refs=[ref for _, ref in cells],
    )


def load_cells(
    cells: list[str],
    path: Path,
    skip_calls: frozenset[str] = frozenset(),
    module_name: str = "cells",
    statement_seconds: float | None = None,
    skip_statements: frozenset[tuple[int, int]] = frozenset(),
    before_statement: Callable[[int, int], None] | None = None,
    kind: str = "code",
    refs: list[CellRef] | None = None,
) -> Loaded:
    """Run code cells (their sources, in order) as `load_notebook` runs a notebook's.

    Each cell's code is named `<NOTEBOOK, NAME>`, NAME its CellRef's English name: from
    `refs` (a notebook's cells: "cell `allreduce-solution`"), else "KIND cell N"; reports
    quote the lines of frames named ", cell ", the student's, and no others.
    """
    install_d2l_alias()
    with launches_skipped(), imported_when_used():
        return _load_cells(
            cells, path, skip_calls, module_name, statement_seconds, skip_statements,
            before_statement, refs or [CellRef(kind, "", n) for n in range(1, len(cells) + 1)],
        )  # fmt: skip


def _load_cells(
    cells: list[str],
    path: Path,
    skip_calls: frozenset[str],
    module_name: str,
    statement_seconds: float | None,
    skip_statements: frozenset[tuple[int, int]],
    before_statement: Callable[[int, int], None] | None,
    refs: list[CellRef],
) -> Loaded:
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    sys.modules[module_name] = module
    loaded = Loaded(path, module.__dict__)
    skip_calls = skip_calls | NEVER_CALLED
    for number, (raw, cell) in enumerate(zip(cells, refs, strict=True), start=1):
        source, note = strip_magics(raw)
        if note:
            said = _("{cell}: {note}").format(cell=said_cell(cell), note=note)
            loaded.notes.append(Note("magic", said, cell))
        filename = f"<{path.name}, {cell.in_english()}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            tree = ast.parse(source, filename=filename)
        except SyntaxError as error:
            said = _(
                "{cell}: syntax error on line {line}: {error}; nothing in this cell was loaded"
            ).format(cell=said_cell(cell), line=error.lineno, error=error.msg)
            loaded.notes.append(Note("syntax", said, cell))
            continue
        for statement in tree.body:
            if (number, statement.lineno) in skip_statements:
                continue
            if before_statement is not None:
                before_statement(number, statement.lineno)
            _run_statement(statement, filename, cell, skip_calls, loaded, statement_seconds)
    return loaded


def _run_statement(
    statement: ast.stmt,
    filename: str,
    cell: CellRef,
    skip_calls: frozenset[str],
    loaded: Loaded,
    seconds: float | None,
) -> None:
    where = {"cell": said_cell(cell), "line": statement.lineno}
    if called := calls_any(statement, skip_calls):
        if called not in NEVER_CALLED:
            said = _(
                "{cell}, line {line}: did not run this call of {function}(...): "
                "the checks call it on tiny data"
            ).format(**where, function=called)
            loaded.notes.append(Note("call-skipped", said, cell))
        return
    code = compile(ast.Module(body=[statement], type_ignores=[]), filename, "exec")
    printed = io.StringIO()
    try:
        with (
            captured(printed),
            time_limit(seconds),
        ):
            exec(code, loaded.namespace)
    except LaunchSkipped:
        pass  # a demo or training run in processes of its own: not for grading
    except TimeLimit:
        said = _(
            "{cell}, line {line}: stopped after {seconds} s (the time limit); loading went on"
        ).format(**where, seconds=f"{seconds:g}")
        loaded.notes.append(Note("stopped", said, cell))
    except (Exception, SystemExit) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        error_said = f"{type(error).__name__}: {message[:200]}" if message else type(error).__name__
        said = _("{cell}, line {line}: raised {error} (loading went on)").format(
            **where, error=error_said
        )
        loaded.notes.append(Note("raised", said, cell))


def cells_by_grade_id(path: Path) -> dict[str, dict]:
    """Return the notebook's nbgrader cells by their grade_id."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return {
        c["metadata"]["nbgrader"]["grade_id"]: c
        for c in nb["cells"]
        if "nbgrader" in c.get("metadata", {})
    }
