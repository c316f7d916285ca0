"""The warm fork server outlives the command that started it: later `python -m grader check`
and `grade` commands run in a session of it, where torch and the checks are imported already,
and report exactly what a command on its own reports."""

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from grader.front.warm_commands import run_warm
from grader.grading import grade_path
from grader.manifest import REPO, load_manifest
from grader.sandbox.fast import preload, warm_client
from tests.conftest import SOLUTIONS, python, write_notebook
from tests.test_hostile import replacing

MANIFEST = load_manifest()
QUICK = ["try_gpu", "allreduce", "split_batch"]


@pytest.fixture
def warm_folder(monkeypatch):
    """A warm folder of the test's own (short: a socket's path has at most 108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="gw-"))
    monkeypatch.setenv("GRADER_WARM_DIR", str(folder))
    monkeypatch.delenv("GRADER_WARM_SECONDS", raising=False)
    yield folder
    warm_client.stop_warm(folder)
    for made in (folder, folder.with_name(f"{folder.name}-cache")):
        shutil.rmtree(made, ignore_errors=True)


def grader(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python(), "-m", "grader", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **env},
    )


def quick_grade(**env: str) -> subprocess.CompletedProcess:
    return grader(
        "grade", str(SOLUTIONS / "from_scratch.ipynb"), *sum((["-e", e] for e in QUICK), []), **env
    )


@pytest.mark.slow
def test_commands_in_the_warm_server_report_what_a_command_on_its_own_does(warm_folder):
    alone = quick_grade(GRADER_WARM_SECONDS="0")
    assert warm_client.warm_servers(warm_folder) == []
    first, second = quick_grade(), quick_grade()
    (server,) = warm_client.warm_servers(warm_folder)  # started by the first, kept for the next
    for warm in (first, second):
        assert warm.returncode == alone.returncode == 0, warm.stderr
        assert warm.stdout == alone.stdout
    assert "total" in alone.stdout


@pytest.mark.slow
def test_bad_input_says_so_the_same_way_from_the_warm_server(warm_folder):
    for warm in ("0", "300"):
        proc = grader("check", str(SOLUTIONS), "-e", "allreduse", GRADER_WARM_SECONDS=warm)
        assert proc.returncode == 2
        assert "no exercise called 'allreduse'" in proc.stderr
    assert len(warm_client.warm_servers(warm_folder)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("server", ["started by the grade", "warm already"])
def test_a_grade_whose_grader_is_killed_stops_with_its_children(warm_folder, server):
    """The grade runs in the warm server when one answers, else in its own process (which
    starts the server): either way its children, forked by a session of the server, stop."""
    if server == "warm already":
        assert quick_grade().returncode == 0
    proc = subprocess.Popen(
        [python(), "-m", "grader", "grade", str(SOLUTIONS)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = found = None
    for _ in range(1200):  # until the grade runs: a session of the server has forked children
        found = warm_client.warm_servers(warm_folder)
        if found and any(children(session) for session in children(found[0])):
            server = found[0]
            break
        time.sleep(0.1)
    assert server is not None, f"the grade never had children forked by a server: {found}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for _ in range(1200):
        if not children(server):
            break
        time.sleep(0.1)
    left = {pid: describe(pid) for pid in children(server)}
    assert not left, f"the command went on without its grader: {left}"


def describe(pid: int) -> str:
    """Return a process's state and what its main thread runs, for a failure's message."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0].decode()
        with open(f"/proc/{pid}/task/{pid}/wchan", "rb") as f:
            return f"{state} {f.read().decode()}"
    except OSError as error:
        return str(error)


def children(pid: int) -> list[int]:
    """Return the processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if int(f.read().rpartition(b")")[2].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError):
                pass
    return found


def test_no_warm_server_where_others_may_enter_its_folder(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("GRADER_WARM_DIR", str(shared))
    assert warm_client.warm_folder() is None
    assert warm_client.connect_warm() is None
    monkeypatch.setenv("GRADER_WARM_DIR", str(tmp_path / "mine"))
    assert warm_client.warm_folder() == tmp_path / "mine"
    assert (tmp_path / "mine").stat().st_mode & 0o777 == 0o700


def test_no_warm_server_when_asked_for_none(monkeypatch):
    monkeypatch.setenv("GRADER_WARM_SECONDS", "0")
    assert warm_client.connect_warm() is None
    assert run_warm([sys.executable, "check"]) is None


def test_the_warm_servers_name_changes_with_the_environment_imports_read():
    env = preload.server_environment(Path("/nowhere"))
    key = warm_client.warm_key(env)
    assert warm_client.warm_key({**env, "DPLAB_FIGURE_DIR": "/elsewhere"}) == key
    assert warm_client.warm_key({**env, "OMP_NUM_THREADS": "7"}) != key
    assert warm_client.warm_key({**env, "PYTHONPATH": "/x"}) != key


@pytest.mark.slow
def test_a_fenced_child_cannot_reach_the_warm_servers_socket(warm_folder, tmp_path, monkeypatch):
    """A connection to the warm server runs grader commands outside the fence, so its folder
    is masked in every child, as the hidden checks are (even code that gets past Python's
    audit hooks, with ctypes, finds nothing there)."""
    monkeypatch.setenv("GRADER_START", "fork")
    assert quick_grade().returncode == 0  # a warm server listens there now
    (socket_file,) = warm_folder.glob("*.sock")
    peek = f"def try_gpu(i=0):\n    import os\n    raise RuntimeError(str(os.listdir({str(warm_folder)!r})))"
    folder = tmp_path / "peek" / MANIFEST.assignment
    write_notebook(folder / "from_scratch.ipynb", *replacing("try_gpu", peek))
    (ex,) = grade_path(folder, ["try_gpu"]).exercises
    said = " ".join(c.message for c in ex.checks)
    assert ex.score == 0
    assert socket_file.name not in said
    assert "Permission denied" in said or "[]" in said, said


class FakeClock:
    """A clock for the warm client's wait: sleeping moves it on, by as much as was asked."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        time.sleep(seconds)


def test_a_warm_server_that_cannot_start_costs_no_wait(warm_folder, monkeypatch):
    """A warm server that ends as it starts (here, a Python that cannot find its standard
    library) is not waited for: the grader goes on without it at once, and later calls in the
    same process neither start it again nor wait. Waiting 30 s on each call made a class
    whose children could not import the grader look hung."""
    monkeypatch.setenv("PYTHONHOME", str(warm_folder / "nowhere"))
    clock = FakeClock()
    monkeypatch.setattr(warm_client, "time", clock)
    assert warm_client.connect_warm() is None
    assert clock.now < 30.0, "it waited for a server that had ended"
    place = warm_client.warm_place()
    assert warm_client._started[place.path].returncode not in (None, 0)
    waited = clock.now
    assert warm_client.connect_warm() is None
    assert clock.now == waited
    assert warm_client.warm_servers(warm_folder) == []


def python_without_the_lab(folder: Path) -> Path:
    """Return a new Python with this one's packages but not the lab's editable install (the
    .pth line adds the packages' folder as a plain path, whose own .pth files are not read):
    the lab is then found only through a folder on its path, as in a checkout that is not
    installed, run with a machine's own PyTorch."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    packages = next((folder / "lib").glob("python*/site-packages"))
    paths = sysconfig.get_paths()
    (packages / "this_pythons.pth").write_text(
        "\n".join(dict.fromkeys([paths["purelib"], paths["platlib"]])) + "\n"
    )
    return folder / "bin" / "python"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["PYTHONPATH=.", "python -m grader in the checkout"])
def test_a_checkout_that_is_not_installed_grades_as_an_installed_one(warm_folder, tmp_path, how):
    """`make gpu-check PYTHON=python3` runs the grader from the checkout with PYTHONPATH=.:
    its children, warm server and fence probe work in other folders, and once met "No module
    named 'grader'", which gave the reference solutions 0 and no fence."""
    plain = python_without_the_lab(tmp_path / "venv")
    alone = subprocess.run([plain, "-c", "import grader"], cwd=tmp_path, capture_output=True)
    assert alone.returncode != 0, "this Python finds the lab without being told where"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": "."} if how == "PYTHONPATH=." else {}
    exercises = sum((["-e", e] for e in QUICK), [])
    proc = subprocess.run(
        [plain, "-m", "grader", "grade", str(SOLUTIONS / "from_scratch.ipynb"), *exercises],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO,
    )
    installed = quick_grade()
    assert proc.returncode == installed.returncode == 0, proc.stderr
    assert proc.stdout == installed.stdout  # the same fence, the same table
