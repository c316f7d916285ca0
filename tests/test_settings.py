"""Every variable the lab reads from the environment is declared in one module per package
(dplab/settings.py, grader/settings.py, and labtext/settings.py for the language), read
nowhere else, and listed in docs/settings.md.

The rule, on all the Python the project ships: every `*.py` file and every Python script (a
`#!...python` first line) of the checkout, but for tests/ and conftest.py (the tests' own set-up)
and the folders that are not the project's (hidden ones, node_modules, build and run outputs).
It is read with `ast`, whatever the variable's name:

- A read is any use of the environment that is not a write: `os.environ[k]`, `.get`,
  `.setdefault`, `k in os.environ`, `os.getenv`, any other use of `os.environ` or `os.environb`
  (passed on, iterated, `.keys()`), whether reached as `os.`, through `import os as ...`,
  `from os import environ, getenv`, `__import__("os")`, or a name bound to any of these
  (`env = os.environ.get`). A write is `os.environ[k] = v`, `del os.environ[k]`, `.update`,
  `.clear`, and a `.pop` whose value goes unused.
- Outside the settings modules every read is an error, but for three kinds, each narrow:
  - a copy of the whole environment (`dict(os.environ, ...)`, `{**os.environ}`,
    `os.environ.items()`, `os.environ.copy()`): it names no variable, and is handed on whole;
  - a `setdefault` whose value goes unused: it only writes a default, for whoever reads next;
  - a variable of ALLOWED, in its file alone: each says in one line why it is not a setting.
"""

import ast
import dataclasses
import fnmatch
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dplab.settings
import grader.settings
import labtext.settings

REPO = Path(__file__).resolve().parent.parent
SETTINGS = (*dplab.settings.ALL, *grader.settings.ALL, *labtext.settings.ALL)
SETTINGS_MODULES = {
    "dplab.settings": dplab.settings,
    "grader.settings": grader.settings,
    "labtext.settings": labtext.settings,
}
SETTINGS_FILES = {"dplab/settings.py", "grader/settings.py", "labtext/settings.py"}
NOT_SHIPPED = {"conftest.py"}  # the tests' own set-up, as tests/ is
NOT_THE_PROJECTS = {"tests", "node_modules", "__pycache__", "build", "work", "class", "results"}

TORCHRUN = "torchrun sets it in each worker it starts, to say which worker this is"
HUB = "JupyterHub's config, run by the hub and not the lab: its top comment lists them"
ALLOWED: tuple[tuple[str, str, str], ...] = (  # (file, variable or pattern, why)
    ("dplab/train_ddp.py", "RANK", TORCHRUN),
    ("dplab/train_ddp.py", "LOCAL_RANK", TORCHRUN),
    ("dplab/train_ddp.py", "WORLD_SIZE", TORCHRUN),
    ("dplab/train_ddp.py", "LOCAL_WORLD_SIZE", TORCHRUN),
    ("dplab/distributed.py", "LOCAL_RANK", TORCHRUN),
    (
        "grader/base/inputs.py",
        "DPLAB_DEVICES",
        "saved to restore it: .get() cannot tell it unset",
    ),
    ("hub/jupyterhub_config.py", "HUB_*", HUB),
    ("hub/jupyterhub_config.py", "LAB_LANG", "handed on to each lab, where grader.settings has it"),
    ("docs/hub/slurm_config.py", "HUB_*", HUB),
    ("hub/lab_exchange.py", "HUB_USER_PREFIX", "nbgrader's collect: the hub hands labs the prefix"),
    ("hub/lab_feedback.py", "HUB_USER_PREFIX", "nbgrader's release_feedback, as collect"),
    ("hub/clear.py", "HUB_*", "the hub's state and account prefix, as its config has them"),
    ("hub/lab_hub.py", "DOCKER_HOST", "Docker's own: where its engine listens, as docker reads it"),
    ("nbgrader_config.py", "LAB_RELEASE_LANGUAGE", "nbgrader's config: `make exercises` sets it"),
    ("docker/lab-config-exchange/nbgrader_config.py", "LAB_EXCHANGE", "nbgrader's, from start-lab"),
    ("docker/lab-config-exchange/nbgrader_config.py", "LAB_COURSE", "nbgrader's, from start-lab"),
    ("docker/lab-config-exchange/nbgrader_config.py", "JUPYTERHUB_USER", "the hub's student"),
    (
        "docker/lab-config-exchange/nbgrader_config.py",
        "HUB_USER_PREFIX",
        "from the hub: each lab its own account, so a submission is closed to it",
    ),
    ("docker/lab-health", "JUPYTER_TOKEN", "the image's health check, run by its own python3"),
    ("docker/lab-health", "LAB_LOGIN_FILE", "the image's health check, run by its own python3"),
    ("docker/lab-health", "LAB_PORT", "the image's health check, run by its own python3"),
    ("docs/make_picture.py", "PATH", "extended, so that the kernel it starts runs this Python"),
    ("hub/bench.py", "PATH", "extended, so that nbgrader finds this Python's alembic"),
)

SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
# What a name or an expression is, where it matters here: the os module, a settings module
# ("settings:<module>"), the environment ("environ"), or one of its functions.
FROM_OS = {"environ": "environ", "environb": "environ", "getenv": "get", "getenvb": "get"}
METHODS = {
    "get": "get",
    "__getitem__": "get",
    "setdefault": "setdefault",
    "pop": "pop",
    "update": "write",
    "clear": "write",
    "__setitem__": "write",
    "__delitem__": "write",
    "items": "copy",
    "copy": "copy",
}  # any other attribute of the environment ("keys", "__contains__"...) reads it too


@dataclass(frozen=True)
class Read:
    """One read of the environment: where, the variable (None where the code does not name
    one: a key computed as it runs, or the whole environment) and its shape: "read", "copy"
    (the whole environment, copied) or "default" (a setdefault whose value goes unused)."""

    path: str
    line: int
    variable: str | None
    shape: str
    code: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code}"


class _Module:
    """A module's scopes and what each binds, read from its tree."""

    def __init__(self, tree: ast.Module) -> None:
        self.parent: dict[ast.AST, ast.AST] = {}
        self.scope: dict[ast.AST, ast.AST] = {}
        self.binds: dict[ast.AST, dict[str, list[ast.AST | str | None]]] = {}
        self._visit(tree, tree)

    def _visit(self, node: ast.AST, scope: ast.AST) -> None:
        if isinstance(node, SCOPES):
            self.binds[node] = {}
            if not isinstance(node, ast.Module):
                self._bind(scope, getattr(node, "name", None), None)
            arguments = getattr(node, "args", None)
            if isinstance(arguments, ast.arguments):
                every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                for arg in (*every, arguments.vararg, arguments.kwarg):
                    if arg is not None:
                        self._bind(node, arg.arg, None)
            scope = node
        self.scope[node] = scope
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if alias.name == "os" or (alias.name.startswith("os.") and not alias.asname):
                    self._bind(scope, bound, "os")
                elif alias.name in SETTINGS_MODULES and alias.asname:
                    self._bind(scope, bound, f"settings:{alias.name}")
                else:
                    self._bind(scope, bound, None)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                what = FROM_OS.get(alias.name) if node.module == "os" else None
                what = f"settings:{full}" if full in SETTINGS_MODULES else what
                self._bind(scope, alias.asname or alias.name, what)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            holder = self.parent.get(node)
            direct = isinstance(holder, ast.Assign | ast.AnnAssign | ast.NamedExpr)
            self._bind(scope, node.id, getattr(holder, "value", None) if direct else None)
        for child in ast.iter_child_nodes(node):
            self.parent[child] = node
            self._visit(child, scope)

    def _bind(self, scope: ast.AST, name: str | None, what: ast.AST | str | None) -> None:
        if name:
            self.binds[scope].setdefault(name, []).append(what)

    def lookup(self, name: str, scope: ast.AST, seen: frozenset[str] = frozenset()) -> str | None:
        """Return what `name` is in `scope`: where any binding of it makes it the environment
        or one of its functions, it is that."""
        start = scope
        while True:
            if name in self.binds[scope] and (
                scope is start or not isinstance(scope, ast.ClassDef)
            ):
                for what in self.binds[scope][name]:
                    if isinstance(what, ast.AST) and name not in seen:
                        what = self.kind(what, seen | {name})
                    if isinstance(what, str):
                        return what
                return None
            if isinstance(scope, ast.Module):
                return None
            scope = self.scope[self.parent[scope]]

    def kind(self, node: ast.AST, seen: frozenset[str] = frozenset()) -> str | None:
        """Return what the expression `node` is: "os", "settings:...", "environ", or the kind
        of one of the environment's functions ("get", "setdefault", "pop", "write", "copy",
        "method"); None for anything else."""
        if isinstance(node, ast.Name):
            return self.lookup(node.id, self.scope[node], seen)
        if isinstance(node, ast.Attribute):
            base = self.kind(node.value, seen)
            if base == "os":
                return FROM_OS.get(node.attr)
            if base == "environ":
                return METHODS.get(node.attr, "method")
            return None
        if isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            called = node.func.id if isinstance(node.func, ast.Name) else None
            called = node.func.attr if isinstance(node.func, ast.Attribute) else called
            if called in ("__import__", "import_module") and _text(first) == "os":
                return "os"
        return None

    def variable(self, key: ast.AST | None) -> str | None:
        """Return the variable that `key` names: a string, or a declaration's `.name`."""
        if _text(key) is not None:
            return _text(key)
        if isinstance(key, ast.Attribute) and key.attr == "name":
            holder = key.value
            if isinstance(holder, ast.Attribute):
                module = self.kind(holder.value) or ""
                module = module.removeprefix("settings:") or ast.unparse(holder.value)
                declared = getattr(SETTINGS_MODULES.get(module), holder.attr, None)
                return getattr(declared, "name", None)
        return None


def _text(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return node.value if isinstance(node.value, str) else node.value.decode()
    return None


def environment_reads(source: str, path: str) -> list[Read]:
    """Return every read of the environment in `source` (the module at `path`), copies of the
    whole environment and setdefaults included, writes left out."""
    tree = ast.parse(source)
    module = _Module(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name | ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        what = module.kind(node)
        if what in (None, "os", "write") or what.startswith("settings:"):
            continue
        up = module.parent[node]
        if isinstance(up, ast.Attribute) and module.kind(up) is not None:
            continue  # (os.environ.get: the use is the whole attribute)
        if isinstance(up, ast.Assign | ast.AnnAssign | ast.NamedExpr) and up.value is node:
            continue  # a name for it: its uses are found where the name is used
        called = isinstance(up, ast.Call) and up.func is node
        key: ast.AST | None = None
        if isinstance(up, ast.Call) and called:
            named = [k.value for k in up.keywords if k.arg == "key"]
            key = [*up.args, *named, None][0]
        unused = called and isinstance(module.parent[up], ast.Expr)
        shape = "read"
        if what == "environ" and isinstance(up, ast.Subscript):
            if not isinstance(up.ctx, ast.Load):
                continue  # os.environ[k] = v, del os.environ[k]
            key = up.slice
        elif what == "environ" and isinstance(up, ast.Compare) and node in up.comparators:
            at = up.comparators.index(node)
            if isinstance(up.ops[at], ast.In | ast.NotIn):
                key = up.left if at == 0 else up.comparators[at - 1]
        elif what == "environ" and isinstance(up, ast.Call) and up.args[:1] == [node]:
            shape = "copy" if isinstance(up.func, ast.Name) and up.func.id == "dict" else shape
        elif what == "environ" and isinstance(up, ast.Dict):
            spread = [v for k, v in zip(up.keys, up.values, strict=True) if k is None]
            shape = "copy" if any(v is node for v in spread) else shape
        elif what == "copy" and called:
            shape = "copy"
        elif what == "setdefault" and unused:
            shape = "default"
        elif what == "pop" and unused:
            continue  # os.environ.pop(k, None): a write
        whole = shape == "read" and key is None and not called  # (os.environ, passed on)
        code = ast.get_source_segment(source, node if whole else up)
        found.append(Read(path, node.lineno, module.variable(key), shape, code or ast.unparse(up)))
    return sorted(found, key=lambda read: read.line)


def project_python() -> Iterator[Path]:
    """Yield every Python file the project ships but the settings modules (see the top)."""
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not name.startswith(".")
            and not name.endswith(".egg-info")
            and name not in NOT_THE_PROJECTS
        )
        for name in sorted(files):
            path = Path(folder, name)
            relative = path.relative_to(REPO).as_posix()
            if relative in SETTINGS_FILES | NOT_SHIPPED:
                continue
            if name.endswith(".py") or (not path.suffix and _is_python_script(path)):
                yield path


def _is_python_script(path: Path) -> bool:
    with path.open("rb") as f:
        first = f.readline(200)
    return first.startswith(b"#!") and b"python" in first


def _allows(path: str, pattern: str, read: Read) -> bool:
    """Whether the allowance of `pattern` in the file at `path` covers `read`."""
    return (
        read.path == path
        and read.variable is not None
        and fnmatch.fnmatchcase(read.variable, pattern)
    )


def errors(reads: list[Read]) -> list[str]:
    """Return the reads that break the rule (see the top), each as `path:line: code`."""
    return [
        str(read)
        for read in reads
        if read.shape == "read" and not any(_allows(p, v, read) for p, v, _ in ALLOWED)
    ]


def tree_reads() -> list[Read]:
    return [
        read
        for path in project_python()
        for read in environment_reads(
            path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix()
        )
    ]


PLANTED = """
import os
import os as system
from os import environ, getenv as fetch
from grader import settings
from dplab import settings as runtime

env = os.environ
get = os.environ.get

a = os.environ["A"]
b = os.environ.get("B", "")
c = os.getenv("C")
d = environ.get("D")
if "E" in os.environ or "E2" not in environ:
    pass
f = os.environ.setdefault("F", "1")
g = fetch("G")
h = env["H"]
i = get("I")
j = __import__("os").environ.get("J")
k = system.environ[settings.SEED.name]
m = os.environ.get(runtime.DEVICES.name)
n = os.environ.pop("N")
for name in ("O1", "O2"):
    o = os.environ.get(name)
p = sorted(os.environ.keys())
q = [os.environb[b"Q"], os.getenvb(b"Q2")]


def helper(getter=os.getenv):
    return getter("R")


def shadowed(env: dict, get=dict.get) -> str:
    return env["NOT_THE_ENVIRONMENT"] + get(env, "NOR_THIS")


os.environ["W"] = "1"
del os.environ["W"]
os.environ.update(W="1")
os.environ.pop("W", None)
os.environ.clear()
os.environ.setdefault("W", "1")
copies = [dict(os.environ), dict(os.environ, W="1"), {**os.environ, "W": "1"}]
copies += [{k: v for k, v in os.environ.items()}, os.environ.copy()]
"""


def test_the_finder_catches_every_shape_of_a_read_planted_in_a_module():
    reads = environment_reads(PLANTED, "grader/planted.py")
    found = [(read.variable, read.line) for read in reads if read.shape == "read"]
    variables = [variable for variable, _ in found]
    assert variables[:14] == [
        "A", "B", "C", "D", "E", "E2", "F", "G", "H", "I", "J", "GRADER_SEED", "DPLAB_DEVICES", "N"
    ]  # fmt: skip
    # os.environ.get(name), .keys() and helper's default (os.getenv, passed on) name none
    assert variables[14:] == [None, None, "Q", "Q2", None], found
    assert len(errors(reads)) == len(found)  # in a module of its own, none is allowed
    assert sorted(read.shape for read in reads if read.shape != "read") == ["copy"] * 5 + [
        "default"
    ]
    assert errors(environment_reads('os = 1\nos.environ.get("X")\n', "x.py")) == []


def test_an_allowance_covers_its_variable_in_its_own_file_alone():
    rank = 'import os\nrank = int(os.environ["RANK"])\nsize = os.environ["SIZE"]\n'
    assert errors(environment_reads(rank, "dplab/train_ddp.py")) == [
        'dplab/train_ddp.py:3: os.environ["SIZE"]'
    ]
    assert len(errors(environment_reads(rank, "dplab/launched.py"))) == 2


def test_nothing_reads_the_environment_outside_the_settings_modules():
    reads = tree_reads()
    reached = {read.path for read in reads}  # (so that a scan of nothing cannot pass)
    assert {
        "grader/front/warm_commands.py",
        "hub/jupyterhub_config.py",
        "docker/lab-health",
    } <= reached
    wrong = errors(reads)
    assert not wrong, (
        "read the environment through dplab.settings, grader.settings or labtext.settings "
        "(declare the variable there and in docs/settings.md), or allow it in "
        "tests/test_settings.py, saying why:\n" + "\n".join(wrong)
    )


def test_every_allowance_is_needed_by_a_read_in_the_tree():
    reads = tree_reads()
    unused = [
        (path, pattern)
        for path, pattern, _ in ALLOWED
        if not any(_allows(path, pattern, read) for read in reads)
    ]
    assert not unused, f"allowances that no read needs: {unused}"


def test_the_settings_modules_declare_every_variable_once():
    names = [s.name for s in SETTINGS]
    assert len(names) >= 20 and len(set(names)) == len(names), names
    assert all(s.help for s in SETTINGS)
    assert {"LAB_LANG", "JPY_SESSION_NAME"} <= {s.name for s in labtext.settings.ALL}


def test_docs_list_every_setting_with_its_default_and_what_it_does():
    """Each variable, and each grading limit's option (grader.base.limits), has its row."""
    from grader.base.limits import OPTIONS, Limits

    text = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| `")}
    expected = {
        f"`{s.name}`": f"| `{s.name}` | {f'`{s.default}`' if s.default else '(none)'} | {s.help} |"
        for s in SETTINGS
    }
    for name, (flag, said) in OPTIONS.items():
        expected[f"`{flag}`"] = f"| `{flag}` | `{getattr(Limits(), name):g}` | {said} |"
    wrong = [row for key, row in expected.items() if rows.get(key) != row]
    assert not wrong, "docs/settings.md should have these rows:\n" + "\n".join(wrong)
    assert not set(rows) - set(expected), (
        f"docs/settings.md lists what nothing declares: {set(rows) - set(expected)}"
    )


def test_every_limit_is_an_option_of_grade():
    """Each grading limit (grader.base.limits) is an option of `grade`, with its default."""
    from grader.base.limits import OPTIONS, Limits

    assert set(OPTIONS) == {f.name for f in dataclasses.fields(Limits)}
    shown = subprocess.run([sys.executable, "-m", "grader", "grade", "--help"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    shown = " ".join(shown.split())
    for name, (flag, said) in OPTIONS.items():
        assert f"{flag} " in shown and f"{said} (default: {getattr(Limits(), name):g})" in shown
