"""Read a notebook's code, and run its definitions without its demos, training runs or launches.

`torchrun -m dplab.train_ddp` uses it to find a notebook's `train_ddp`; the grader's loader
(grader.load.notebook) reads notebooks with the same rules and adds its own notes and limits.
"""

import ast
import json
import sys
import types
from pathlib import Path

import dplab
from dplab.launched import LaunchSkipped, launches_skipped
from labtext import _

# Never run while loading: the notebook's own check cells (grading runs the checks) and its
# launches of process groups (`d2l.launch(...)`: demos and training runs, for people).
NEVER_CALLED = frozenset({"check", "launch"})


class NotebookError(Exception):
    """The file cannot be read as a notebook at all."""


def install_d2l_alias() -> None:
    """Make `import d2l`, `from d2l import torch as d2l` and `import d2l.torch` give dplab."""
    package = types.ModuleType("d2l", "Stand-in for the d2l package: its torch part is dplab.")
    package.torch = dplab
    package.__path__ = []
    sys.modules["d2l"] = package
    sys.modules["d2l.torch"] = dplab


def _code_cells(path: Path) -> list[tuple[dict, str]]:
    """Return (cell, source) for each of the notebook's code cells, or raise NotebookError
    saying why not."""
    name = Path(path).name  # (the grader reads a copy: its folder means nothing to the student)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotebookError(_("{name} does not exist").format(name=name)) from None
    except (OSError, UnicodeDecodeError) as error:
        raise NotebookError(
            _("{name} cannot be read: {error}").format(name=name, error=type(error).__name__)
        ) from None
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as error:
        raise NotebookError(
            _(
                "{name} is not valid JSON ({error} at line {line}); open it in JupyterLab and "
                "save it again, or submit a fresh copy"
            ).format(name=name, error=error.msg, line=error.lineno)
        ) from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError(
            _("{name} is JSON but not a notebook: it has no list of cells").format(name=name)
        )
    cells = []
    for cell in nb["cells"]:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            source = cell.get("source", "")
            cells.append((cell, "".join(source) if isinstance(source, list) else str(source)))
    return cells


def read_cells(path: Path) -> list[str]:
    """Return the sources of the notebook's code cells, or raise NotebookError saying why not."""
    return [source for _cell, source in _code_cells(path)]


def read_code_cells(path: Path) -> list[tuple[str, str]]:
    """Return (source, label) for each of the notebook's code cells: the label names the cell
    as JupyterLab shows it (see `cell_label`)."""
    cells = named_cells(path)
    return [(source, label_of(kind, name, n)) for n, (source, kind, name) in enumerate(cells, 1)]


def named_cells(path: Path) -> list[tuple[str, str, str]]:
    """Return (source, how it is named, the name) for each of the notebook's code cells (see
    `cell_parts`)."""
    return [(source, *cell_parts(cell, source)) for cell, source in _code_cells(path)]


def cell_parts(cell: dict, source: str) -> tuple[str, str]:
    """Return how a student finds a code cell in JupyterLab, which shows no cell numbers, and
    by what: ("grade id", its grade id), else ("defines", the function or class it defines),
    else ("first line", its first line); ("empty", "") for an empty cell."""
    metadata = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
    grade_id = (metadata.get("nbgrader") or {}).get("grade_id")
    if isinstance(grade_id, str) and grade_id:
        return "grade id", grade_id
    try:
        defined = [
            node.name
            for node in ast.parse(strip_magics(source)[0]).body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
    except SyntaxError:
        defined = []
    if defined:
        return "defines", defined[0]
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("#")] or lines
    if not lines:
        return "empty", ""
    return "first line", lines[0] if len(lines[0]) <= 40 else lines[0][:37] + "..."


def label_of(kind: str, name: str, number: int) -> str:
    """Name a code cell as `cell_parts` found it (`allreduce-solution` in backticks, "that
    defines `f`", "number 3 (empty)"), in English: a cell's code is named by it."""
    if kind == "defines":
        return f"that defines `{name}`"
    if kind == "empty":
        return f"number {number} (empty)"
    return f"`{name}`"


def cell_label(cell: dict, source: str, number: int) -> str:
    """Name a code cell as a student finds it in JupyterLab (see `cell_parts`)."""
    return label_of(*cell_parts(cell, source), number)


def strip_magics(source: str) -> tuple[str, str | None]:
    """Blank out IPython-only lines; return the code and a note if something was dropped."""
    lines = source.splitlines()
    first = lines[0].strip() if lines else ""
    if first.startswith("%%"):
        if first.split()[0] in ("%%time", "%%capture"):
            return "\n".join([""] + lines[1:]), None
        return "", _("skipped a {magic} cell magic").format(magic=first.split()[0])
    kept: list[str] = []
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")) and not continues(kept):
            indent = line[: len(line) - len(stripped)]
            kept.append(f"{indent}pass" if indent else "")
        else:
            kept.append(line)
    return "\n".join(kept), None


def continues(lines: list[str]) -> bool:
    """Return True when `lines` end inside a statement (an open bracket or string, or a
    backslash), so that a next line starting with `%` is code (`% (epoch, acc))` of a
    two-line format), not a magic: IPython reads magics only where a statement starts."""
    import io
    import tokenize

    text = "\n".join(lines) + "\n"
    try:
        for _token in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except tokenize.TokenError:
        return True
    except (IndentationError, SyntaxError):
        return False
    return False


def calls_any(node: ast.AST, names: frozenset[str]) -> str | None:
    """Return the name of a function in `names` that `node` calls at top level, if any:
    `train(...)`, `d2l.launch(...)`, or a call that hands one over to run, such as
    `d2l.launch(train_ddp, ...)` or `mp.spawn(train_ddp, ...)`.

    Calls inside function or class bodies and lambdas do not count: defining is not running.
    """
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
        return None
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in names:
            return func.id
        if isinstance(func, ast.Attribute) and func.attr in names & NEVER_CALLED:
            return func.attr  # d2l.launch(...), but not net.train()
        for argument in [*node.args, *(k.value for k in node.keywords)]:
            if isinstance(argument, ast.Name) and argument.id in names:
                return argument.id
    for child in ast.iter_child_nodes(node):
        if found := calls_any(child, names):
            return found
    return None


def definitions(path: Path, skip_calls: frozenset[str] = frozenset()) -> dict:
    """Run the notebook's code cells top to bottom, a top-level statement at a time, and
    return the names they define. A statement that calls one of `skip_calls` or launches
    processes is not run, and an error in a statement stops the loading (raised)."""
    install_d2l_alias()
    namespace: dict = {"__name__": f"notebook_{Path(path).stem.replace('-', '_')}"}
    with launches_skipped():
        for raw, label in read_code_cells(path):
            source = strip_magics(raw)[0]
            filename = f"<{Path(path).name}, cell {label}>"
            for statement in ast.parse(source, filename=filename).body:
                if calls_any(statement, skip_calls | NEVER_CALLED):
                    continue
                code = compile(ast.Module(body=[statement], type_ignores=[]), filename, "exec")
                try:
                    exec(code, namespace)
                except LaunchSkipped:
                    pass  # a demo or a training run in processes of its own
    return namespace
