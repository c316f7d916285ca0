"""The lab's layers: every import of `labtext/`, `dplab/`, `grader/` and `hub/` goes down the
layers or stays in its own, and no modules import each other in a circle. The graph is read
from the source with `ast`, imports inside functions included (they still tie the modules
together), and so is what Python runs for an import besides the module: the `__init__` of each
package above it (`import grader.load.notebook` runs `grader/__init__.py` first)."""

import ast
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("labtext", "dplab", "grader", "hub")

# From the bottom. Each module is named by exactly one entry: its own name, or `package.*`,
# which names a package and every module under it.
LAYERS = {
    # The lab's texts and their lookup: nothing of the lab (nor torch), so that both the
    # runtime and the grader can import it, and a command reaches the warm server first.
    "texts": ("labtext.*",),
    # The lab's library, the book's d2l for this lab: it knows nothing of the grader.
    "runtime": ("dplab.*",),
    # What checks are written with: the grader's settings, the manifest and the base types.
    "base": ("grader.settings", "grader.manifest", "grader.base.*"),
    # Process groups of ranks, for the distributed exercises' cases: made of the base alone.
    "ranks": ("grader.ranks.*",),
    # The one module checks import (grader.api), which hands out the ranks' tools.
    "vocabulary": ("grader.api",),
    "exercises": ("grader.exercises.*",),
    "load": ("grader.load.*",),
    "sandbox": ("grader.sandbox.*",),
    "judge": ("grader.judge.*",),
    "report": ("grader.report.*",),
    # One submission graded, as a pipeline of the steps above.
    "pipeline": ("grader.grading", "grader.class_grading", "grader.pace"),
    # The authors' tools, which the command line offers: the mistake catalogue's table, the
    # translations' catalogues and notebooks.
    "authoring": ("grader.tools.*",),
    # Ways in: the notebook's `check` (the package itself), the command line, a class, the
    # kernel, Gradescope, merge, the warm server and the pytest plugin.
    "front ends": ("grader", "grader.__main__", "grader.front.*"),
    # The maintainers' measures (make bench-*, make gpu-check), which drive the front ends.
    "benchmarks": ("grader.benchmarks.*",),
    # A class's JupyterHub, its config and nbgrader's exchange for the instructor: it uses the
    # grader from above, and nothing of the lab imports it.
    "hub": ("hub.*",),
}
ORDER = list(LAYERS)


def modules() -> dict[str, Path]:
    """Return every module of the lab's packages by its dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def ancestors(name: str) -> list[str]:
    """The packages above a module, from the top: grader, grader.load for grader.load.x."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Return the modules of `known` that importing the module `name` runs: those it imports,
    and the packages above each of them (but its own, which ran before it)."""

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
    found.discard(None)
    own = set(ancestors(name)) | {name}
    return (found | {a for m in found for a in ancestors(m) if a in known}) - own


def entries(name: str) -> list[tuple[str, str]]:
    """The (layer, entry) pairs of LAYERS that name the module `name`."""
    return [
        (layer_name, entry)
        for layer_name, named in LAYERS.items()
        for entry in named
        if name == entry.removesuffix(".*")
        or (entry.endswith(".*") and name.startswith(entry.removesuffix("*")))
    ]


def layer(name: str) -> str:
    """Return the layer of a module (see LAYERS)."""
    (found, _entry), *_ = entries(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_the_graph_is_read_from_the_code(graph):
    """The reader finds the imports it must: a check imports the vocabulary, the grading
    child the loader, the command line the pipeline, and a module of a package the packages
    above what it imports (so an empty graph cannot pass)."""
    assert "grader.api" in graph["grader.exercises.allreduce.checks"]
    assert "grader.load.notebook" in graph["grader.sandbox.child"]
    assert "grader.grading" in graph["grader.front.cli"]
    assert "grader.load" in graph["grader.sandbox.child"]  # above grader.load.notebook
    assert "grader.sandbox" not in graph["grader.sandbox.child"]  # its own package ran first
    assert layer("dplab.distributed") == "runtime"
    assert layer("grader.ranks.pools") == "ranks" and layer("grader.api") == "vocabulary"
    assert layer("grader") == "front ends" and layer("grader.benchmarks.grade") == "benchmarks"


def test_every_module_is_named_in_exactly_one_layer():
    """No catch-all: a new module must be given its layer, and no module sits in two."""
    named = {name: entries(name) for name in modules()}
    unnamed = sorted(name for name, found in named.items() if not found)
    twice = sorted(f"{name}: {found}" for name, found in named.items() if len(found) > 1)
    assert not unnamed, "modules in no layer of LAYERS: " + ", ".join(unnamed)
    assert not twice, "modules in two places of LAYERS:\n" + "\n".join(twice)
    used = {entry for found in named.values() for _layer, entry in found}
    stale = [entry for names in LAYERS.values() for entry in names if entry not in used]
    assert not stale, f"entries of LAYERS that name no module: {stale}"


def test_no_import_goes_up_a_layer(graph):
    upward = [
        f"{name} ({layer(name)}) imports {other} ({layer(other)})"
        for name, found in sorted(graph.items())
        for other in sorted(found)
        if ORDER.index(layer(other)) > ORDER.index(layer(name))
    ]
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)


def test_the_runtime_and_the_texts_import_nothing_of_the_grader(graph):
    """dplab is the students' library, and labtext the texts of both: neither imports the
    grader, so that neither drags the grader's package in (its `check`, the sandbox)."""
    wrong = sorted(
        f"{name} imports {other}"
        for name, found in graph.items()
        if name.split(".")[0] in ("dplab", "labtext")
        for other in found
        if other.split(".")[0] == "grader"
    )
    assert not wrong, "\n".join(wrong)
    assert {"labtext"} <= graph["dplab.training"]  # what it may import, it is seen to
    assert graph["labtext.settings"] == set()


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
    """A check author's vocabulary is `grader.api` (and the public checks); a catalogue of
    mistakes uses `grader.exercises.catalogue`. No exercise module imports anything private
    (a hidden check, a mistake), which the students' image lacks."""
    wrong = [
        f"{name} imports {other}"
        for name, found in sorted(graph.items())
        if layer(name) == "exercises"
        for other in sorted(found)
        if other.startswith("grader.")
        and other != "grader.api"
        and not other.startswith("grader.exercises.")
    ]
    wrong += [
        f"{name}, which students get, imports {other}"
        for name, found in sorted(graph.items())
        if layer(name) == "exercises" and ".private" not in name
        for other in sorted(found)
        if ".private" in other
    ]
    assert not wrong, "\n".join(wrong)


FAST = "grader.sandbox.fast"


# Those that may import the fast path: the one place that chooses it (and the benchmarks,
# which measure it).
CHOOSE_THE_FAST_PATH = ("grader.pace", "grader.benchmarks.")


def test_the_plain_sandbox_reaches_the_fast_path_through_one_interface(graph):
    """Nothing imports the fast path but grader.pace, which passes what it lends to the
    sandbox as a grader.sandbox.speedups.Speedups: the plain sandbox, the pipeline and the
    front ends import none of it, and the fast path's setting is read in grader.pace alone,
    so that `GRADER_FAST=off` has one place to take effect."""
    wrong = [
        f"{name} imports {other}"
        for name, found in sorted(graph.items())
        if not name.startswith((FAST, *CHOOSE_THE_FAST_PATH))
        for other in sorted(found)
        if other == FAST or other.startswith(FAST + ".")
    ]
    assert not wrong, "\n".join(wrong)
    readers = sorted(
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "FAST.get()" in path.read_text(encoding="utf-8")
    )
    assert readers == ["grader/pace.py"]


# What the pipeline alone joins: a front end reaches the sandbox through grader.grading (or
# grader.class_grading), the judge judges what it is given without the sandbox's types, and
# the report writes the verdicts (grader.base.results) without the judge.
KEPT_APART = (
    ("grader.front", "grader.sandbox"),
    ("grader.judge", "grader.sandbox"),
    ("grader.report", "grader.judge"),
)


def test_the_pipeline_owns_the_route(graph):
    """One walk goes front -> pipeline -> load -> sandbox -> judge -> report: no front end
    enters the sandbox, no judge reads the sandbox, no report reads the judge."""
    wrong = [
        f"{name} imports {other}"
        for name, found in sorted(graph.items())
        for upper, lower in KEPT_APART
        if name == upper or name.startswith(upper + ".")
        for other in sorted(found)
        if other == lower or other.startswith(lower + ".")
    ]
    assert not wrong, "\n".join(wrong)


# The steps of one grade, in the order a walk takes them.
STAGES = ("front ends", "pipeline", "load", "sandbox", "judge", "report")


def test_one_walk_never_climbs_back(tmp_path):
    """Every call made while a submission is graded (the command line's `grade`, a
    notebook of process groups among its two, in the grader's own process), watched with
    sys.setprofile: along front -> pipeline -> load -> sandbox -> judge -> report, no module
    calls code of a step above its own (the sandbox asked the class run how many notebooks
    to grade at once; it now reads a value the class run keeps up to date). Calls up into
    code handed down as a value are the checks' own (a check's function run in processes
    apart by grader.ranks, a case's inputs made by its exercise's lambda), not the walk's."""
    import json
    import subprocess
    import sys

    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.climbs", "grade", str(REPO / "solutions" / "multigpu"),
         "-e", "allreduce", "-e", "ring_allreduce", "--json", str(out)],
        cwd=REPO, env={**os.environ, "GRADER_WARM_SECONDS": "0"}, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.exists()
    calls = json.loads(done.stdout.strip().splitlines()[-1])
    between = {tuple(c["layers"]) for c in calls}
    walked = [("front ends", "pipeline"), ("pipeline", "load"), ("pipeline", "sandbox")]
    walked += [("pipeline", "judge"), ("pipeline", "report")]
    assert set(walked) <= between, sorted(between)  # (the watch saw the walk)
    up = [c for c in calls if c["up"] and set(c["layers"]) <= set(STAGES)]
    assert not up, "\n".join(f"{c['from']} -> {c['to']}: {c['calls']} calls" for c in up)


def test_the_plain_sandbox_reads_alone_in_about_2300_lines():
    """What runs one child and watches it, without the fast path (grader/sandbox/*.py, not
    fast/), is short enough to read whole: the speed ideas stay in fast/."""
    plain = sorted((REPO / "grader" / "sandbox").glob("*.py"))
    lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in plain)
    assert lines <= 2350, f"the plain sandbox has {lines} lines"


def test_grading_without_the_fast_path_never_imports_it(tmp_path):
    """`GRADER_FAST=off`: a grade runs the plain path alone, and the grader imports nothing
    of grader.sandbox.fast (PYTHONPROFILEIMPORTTIME lists every import it makes; the
    children, which start afresh then, choose nothing)."""
    import subprocess
    import sys

    notebook = tmp_path / "from_scratch.ipynb"
    notebook.write_bytes((REPO / "solutions" / "multigpu" / "from_scratch.ipynb").read_bytes())
    env = {**os.environ, "GRADER_FAST": "off", "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "grader", "grade", str(tmp_path), "-e", "try_gpu"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    imported = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert any("grader.sandbox.supervisor" in line for line in imported)  # (it is listing)
    assert not [line for line in imported if FAST in line], "GRADER_FAST=off imported it"


def test_the_graders_root_shows_its_architecture():
    """At most 8 modules at the grader's top; the rest is in folders named for their part."""
    root = sorted(p.name for p in (REPO / "grader").glob("*.py"))
    assert len(root) <= 8, root


# Module names that more than one package has, each for the same job in its own package.
SHARED_NAMES = {
    "settings": "each package's variables of the environment (tests/test_settings.py)",
    "notebook": "dplab reads a notebook's definitions; grader.load.notebook does so for grading",
}


def test_no_two_modules_share_a_name_for_different_jobs():
    """`watch`, `warm`, `results`, `limits` and `devices` each named two things once. The
    exercises' folders share their exercises' names, and hold the same three modules, by
    design."""
    by_name: dict[str, list[str]] = {}
    for name in modules():
        parts = name.split(".")
        if parts[-1] in ("__init__", "__main__") or name.startswith("grader.exercises."):
            continue
        by_name.setdefault(parts[-1], []).append(name)
    shared = {n: found for n, found in by_name.items() if len(found) > 1 and n not in SHARED_NAMES}
    assert not shared, shared


# Public functions and classes that more than one module has, each for the same job.
SHARED_FUNCTIONS = {
    "main": "each command's entry point (`python -m ...`)",
    # dplab.sim stands in for torch's own functions on stand-in devices, under torch's names
    # (torch.cuda.comm.gather and nn.parallel.gather, torch.cuda.synchronize, ...), and
    # dplab.devices gives d2l's.
    "gather": "torch's name: dplab.sim.comm and dplab.sim.parallel stand in for both",
    "scatter": "d2l's (dplab.devices) and torch.cuda.comm's (dplab.sim.comm)",
    "synchronize": "d2l's (dplab.devices) and torch.cuda's (dplab.sim.device)",
}


def test_no_two_public_functions_share_a_name_for_different_jobs():
    """`check` named the kernel's check(), the checks' decorator and more; `serve`, `run`,
    `problems`, `verdicts` and `measure` two or three things each. Top-level public functions
    and classes of the lab's packages (not the exercises' folders, which share their layout by
    design) have a name of their own, or one of SHARED_FUNCTIONS."""
    by_name: dict[str, list[str]] = {}
    for name, path in modules().items():
        if name.startswith("grader.exercises."):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            if isinstance(node, kinds) and not node.name.startswith("_"):
                by_name.setdefault(node.name, []).append(name)
    shared = {
        n: found for n, found in by_name.items() if len(found) > 1 and n not in SHARED_FUNCTIONS
    }
    assert not shared, shared
    # (the exported `check` is the notebook's alone: checks are declared with `check_on`)
    assert by_name["check"] == ["grader"]


# Functions that are tables, read as one: argparse's.
LONG_TABLES = {"grader/front/cli.py:parser"}


def test_no_function_is_over_60_lines():
    """A function a reader can hold at once: past 60 lines, its steps get names of their own."""
    long = {}
    for package in ("grader", "dplab", "hub"):
        for path in (REPO / package).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    where = f"{path.relative_to(REPO)}:{node.name}"
                    if (n := node.end_lineno - node.lineno + 1) > 60 and where not in LONG_TABLES:
                        long[where] = n
    assert not long, f"functions over 60 lines: {long}"


def test_every_folder_says_what_it_is_for_and_what_it_may_import():
    """Each package's docstring opens with a paragraph of two to five lines that says what it
    is for and what it may import; hub/, not a package, says it in its README."""
    unsaid = {}
    for package in PACKAGES:
        for init in sorted((REPO / package).rglob("__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
            first = doc.split("\n\n")[0].splitlines()
            if not 2 <= len(first) <= 5 or "import" not in " ".join(first).lower():
                unsaid[str(init.parent.relative_to(REPO))] = first
    readme = (REPO / "hub" / "README.md").read_text(encoding="utf-8").split("\n\n")
    if not 2 <= len(readme[1].splitlines()) <= 5 or "import" not in readme[1].lower():
        unsaid["hub"] = readme[1]
    assert not unsaid, unsaid


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
        for pattern in ("*/checks.py", "*/private/hidden.py")
        for path in (REPO / "grader" / "exercises").glob(pattern)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module == "grader.api"
        for alias in node.names
    }
    assert "every_rank" in used and "check_on" in used
    assert not used - set(grader.api.__all__), sorted(used - set(grader.api.__all__))
    assert all(hasattr(grader.api, name) for name in grader.api.__all__)


def test_a_command_reaches_the_warm_server_before_it_imports_torch():
    """`python -m grader check` imports what connects to the warm server first, and runs there
    if one answers (0.3 s): torch (1.5 s and more) must not come in with it, through a
    message looked up in labtext or anything else."""
    import subprocess
    import sys

    code = (
        "import sys; from grader import settings; from grader.front import warm_commands; "
        "from grader.sandbox.fast import forkserver, warm_server as fast; "
        "print(sorted(m for m in ('torch', 'dplab') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


# The fast path and the fence: what grading children need, and a kernel does not; and the
# process groups, which a one-process exercise has no use for.
NOT_IN_A_KERNEL = (
    "grader.ranks.apart",
    "grader.ranks.groups",
    "grader.ranks.loopback",
    "grader.ranks.plugins",
    "grader.ranks.pools",
    "grader.ranks.rankpool",
    "grader.ranks.recording",
    "grader.ranks.launching",
    "grader.sandbox.fast.forkserver",
    "grader.sandbox.fast.preload",
    "grader.sandbox.fence",
    "grader.sandbox.audit",
    "grader.sandbox.supervisor",
    "grader.sandbox.starting",
    "grader.sandbox.scheduler",
    "grader.sandbox.fast.warm_client",
    "grader.front.warm_commands",
)


def test_check_in_a_kernel_loads_only_what_its_exercise_needs():
    """`check("allreduce", allreduce)` in a notebook runs the cases in the kernel itself: it
    has no use for the fork server, the warm server or the fence, nor, for a one-process
    exercise, for process groups, and should not wait for them to load: at most 40 of the
    grader's modules (38 now; 47 when every check loaded the ranks' tools)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from grader import check\n"
        "def allreduce(data):\n"
        "    for i in range(1, len(data)):\n"
        "        data[0][:] += data[i].to(data[0].device)\n"
        "    for i in range(1, len(data)):\n"
        "        data[i][:] = data[0].to(data[i].device)\n"
        "points = check('allreduce', allreduce)\n"
        "lab = sorted(m for m in sys.modules if m.split('.')[0] in ('grader', 'dplab', 'labtext'))\n"
        "print(points, len(lab), *lab)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    points, count, *loaded = done.stdout.split("\n")[-2].split()
    assert float(points) > 0, done.stdout  # the check ran, and the book's allreduce earned points
    wrong = sorted(set(loaded) & set(NOT_IN_A_KERNEL))
    assert not wrong, f"check() in a kernel loaded {wrong} ({count} of the lab's modules)"
    graders = [m for m in loaded if m.split(".")[0] == "grader"]
    assert len(graders) <= 40, f"check() in a kernel loaded {len(graders)} modules: {graders}"
