"""The grader's layers: every import of `grader/` and `dplab/` goes down the layers or stays in
its own, and no modules import each other in a circle. The graph is read from the source with
`ast`, imports inside functions included (they still tie the modules together)."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# From the bottom. A module belongs to the first layer one of whose names is itself or one of
# its packages; `grader` itself (the notebook's `check`) and the modules of no layer are front
# ends, at the top.
LAYERS = {
    # grader.i18n looks up the messages of both dplab and the grader: it imports nothing of
    # either (nor torch) but grader.settings, which imports nothing itself, so that a command
    # that imports it is not slowed before the warm server answers.
    "runtime": ("dplab", "grader.i18n", "grader.settings"),
    "vocabulary": (
        "grader.i18n",
        "grader.manifest",
        "grader.settings",
        "grader.devices",
        "grader.limits",
        "grader.watch",
        "grader.base",
        "grader.fixtures",
        "grader.ranks",
        "grader.api",
    ),
    "exercises": ("grader.checks", "grader.hidden", "grader.mistakes"),
    "load": ("grader.load",),
    "sandbox": ("grader.sandbox",),
    "judge": ("grader.judge",),
    "report": ("grader.report",),
    "front ends": ("grader",),
}
ORDER = list(LAYERS)


def modules() -> dict[str, Path]:
    """Return every module of grader/ and dplab/ by its dotted name."""
    found = {}
    for package in ("grader", "dplab"):
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Return the modules of `known` that the module `name` imports."""

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {owner(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else owner(base))
    return found - {None, name}


def layer(name: str) -> str:
    """Return the layer of a module (see LAYERS)."""
    for layer_name, prefixes in LAYERS.items():
        if layer_name != "front ends" and any(
            name == p or name.startswith(p + ".") for p in prefixes
        ):
            return layer_name
    return "front ends"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_the_graph_is_read_from_the_code(graph):
    """The reader finds the imports it must: a check imports the vocabulary, the grading
    child the loader, the command line the pipeline (so an empty graph cannot pass)."""
    assert "grader.api" in graph["grader.checks.allreduce"]
    assert "grader.load.notebook" in graph["grader.sandbox.child"]
    assert "grader.grading" in graph["grader.cli"]
    assert layer("dplab.distributed") == "runtime"
    assert layer("grader.ranks.pools") == "vocabulary"
    assert layer("grader.warm") == layer("grader") == "front ends"


def test_no_import_goes_up_a_layer(graph):
    upward = [
        f"{name} ({layer(name)}) imports {other} ({layer(other)})"
        for name, found in sorted(graph.items())
        for other in sorted(found)
        if ORDER.index(layer(other)) > ORDER.index(layer(name))
    ]
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)


def test_the_runtime_takes_of_the_grader_its_messages_alone(graph):
    """grader.settings sits in the runtime layer for grader.i18n's sake (a leaf: os and
    dataclasses); dplab still reaches the grader through grader.i18n alone, and no further."""
    reached = {
        other
        for name, found in graph.items()
        if name.split(".")[0] == "dplab"
        for other in found
        if other.split(".")[0] == "grader"
    }
    assert reached == {"grader.i18n"}, reached
    assert graph["grader.settings"] == set()


def test_no_modules_import_each_other_in_a_circle(graph):
    circles = []
    state: dict[str, int] = {}  # 1: on the path being followed, 2: done

    def follow(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                circles.append(path[path.index(other) :] + [other])
            elif other not in state:
                follow(other, [*path, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            follow(name, [name])
    assert not circles, "circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_checks_modules_use_the_grader_through_its_api_alone(graph):
    """A check author's vocabulary is `grader.api` (and the exercise's own public checks)."""
    wrong = [
        f"{name} imports {other}"
        for name, found in sorted(graph.items())
        if layer(name) == "exercises" and not name.startswith("grader.mistakes")
        for other in sorted(found)
        if other.startswith("grader.")
        and other != "grader.api"
        and not other.startswith("grader.checks.")
    ]
    assert not wrong, "\n".join(wrong)


def test_no_file_is_over_500_lines():
    long = {
        str(path.relative_to(REPO)): n
        for path in modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert not long, f"files over 500 lines: {long}"


def test_the_api_lists_every_name_a_checks_module_uses():
    """`grader.api.__all__` is a check author's whole vocabulary: every name the checks and
    hidden checks import from it is listed there."""
    import grader.api

    used = {
        alias.name
        for folder in ("checks", "hidden")
        for path in (REPO / "grader" / folder).glob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module == "grader.api"
        for alias in node.names
    }
    assert "every_rank" in used and "check" in used
    assert not used - set(grader.api.__all__), sorted(used - set(grader.api.__all__))
    assert all(hasattr(grader.api, name) for name in grader.api.__all__)


def test_a_command_reaches_the_warm_server_before_it_imports_torch():
    """`python -m grader check` imports what connects to the warm server first, and runs there
    if one answers (0.3 s): torch (1.5 s and more) must not come in with it, through a
    message looked up in grader.i18n or anything else."""
    import subprocess
    import sys

    code = (
        "import sys; from grader import settings, warm; from grader.sandbox import forkserver; "
        "print(sorted(m for m in ('torch', 'dplab') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
