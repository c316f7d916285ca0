"""The fence's inner layer, Python's audit hook, holds even where no namespace is allowed."""

import os
import socket
import subprocess
import sys

import pytest

from grader.manifest import REPO, load_manifest
from grader.sandbox.fence import choose_fence, private_paths
from tests.conftest import hidden_checks_file

SNIPPET = """
import os, socket, sys
from pathlib import Path
from grader.sandbox.audit import install_audit_hook
scratch = Path(sys.argv[1])
install_audit_hook(scratch, [Path(p) for p in sys.argv[2:]])
def attempt(what, action):
    try:
        action()
        print(what, "allowed")
    except PermissionError as error:
        print(what, "refused:", error)
attempt("connect", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
attempt("read", lambda: open(sys.argv[2] + "/hidden.py").read())
attempt("write", lambda: open({outside!r}, "w").write("x"))
attempt("scratch", lambda: open(scratch / "ok.txt", "w").write("x"))
attempt("spawn", lambda: os.system("true"))
"""


def test_the_audit_hook_refuses_network_private_files_writes_and_processes(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    outside = str(tmp_path / "elsewhere.txt")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code = SNIPPET.replace("{port}", str(port)).replace("{outside!r}", repr(outside))
    hidden = str(hidden_checks_file().parent)
    proc = subprocess.run(
        [sys.executable, "-c", code, str(scratch), hidden],
        capture_output=True,
        text=True,
        timeout=60,
    )
    server.close()
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["connect"].startswith("refused: network use is not allowed")
    assert lines["read"].startswith("refused:") and "private to the grader" in lines["read"]
    assert lines["write"].startswith("refused: writing")
    assert lines["scratch"] == "allowed"
    assert lines["spawn"].startswith("refused: starting processes")


def test_the_private_folders_are_the_hidden_checks_solutions_mistakes_and_history():
    found = {str(p.relative_to(REPO)) for p in private_paths() if p.is_relative_to(REPO)}
    exercises = {f"grader/exercises/{ex.id}/private" for ex in load_manifest().exercises}
    assert exercises | {"solutions/multigpu", ".git"} <= found
    for folder in exercises:  # each holds its exercise's hidden checks and mistakes
        assert {"hidden.py", "mistakes.py"} <= {p.name for p in (REPO / folder).iterdir()}


def test_the_fence_says_what_it_enforces():
    assert choose_fence().description


@pytest.mark.slow
def test_without_namespaces_the_audit_hook_still_keeps_a_submission_in(tmp_path):
    """Where no namespace is allowed, the private files and the network stay out of reach."""
    import json
    import os
    import socket as sockets

    from tests.conftest import SOLUTIONS, write_notebook
    from tests.test_hostile import replacing

    server = sockets.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    port = server.getsockname()[1]
    private = [str(hidden_checks_file()), str(SOLUTIONS / "concise.ipynb")]
    body = (
        "def get_params(params, device):\n"
        f"    for path in {private!r}:\n"
        "        try:\n            open(path).read()\n        except OSError:\n            continue\n"
        "        raise RuntimeError('read ' + path)\n"
        "    import socket\n    try:\n"
        f"        socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "        raise RuntimeError('connected')\n    except OSError:\n        pass\n"
        "    return [p.detach().to(device, copy=True).requires_grad_() for p in params]"
    )
    folder = tmp_path / "eve" / "multigpu"
    write_notebook(folder / "from_scratch.ipynb", *replacing("get_params", body))
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grader",
            "grade",
            str(folder),
            "-e",
            "get_params",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, GRADER_FENCE="none"),
    )
    try:
        server.accept()
        connected = True
    except OSError:
        connected = False
    server.close()
    assert proc.returncode == 0, proc.stderr
    assert "sandbox: no operating-system fence" in proc.stdout
    (sub,) = json.loads(out.read_text())["submissions"]
    assert sub["score"] == 11, sub["exercises"][0]["checks"]
    assert not connected


# What a training loop's DataLoader and a student's own code try, behind the hook (each line
# printed: what, then "allowed" with what came back, or "refused: why").
LOADERS = """
import multiprocessing, os, socket, sys
from pathlib import Path
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from grader.sandbox.audit import install_audit_hook
install_audit_hook(Path(sys.argv[1]), [])
data = TensorDataset(torch.arange(10.0), torch.arange(10))

class Forks(Dataset):  # a Dataset that, in its worker, starts a process of its own
    def __len__(self):
        return 4
    def __getitem__(self, i):
        os.fork()
        return i

class Connects(Forks):
    def __getitem__(self, i):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
        return i

def work():
    pass

class Mine(multiprocessing.context.ForkProcess):  # a context whose processes run my code
    def run(self):
        work()

class MyContext(type(multiprocessing.get_context("fork"))):
    Process = Mine

class MyRun(type(multiprocessing.get_context("fork"))):  # torch's worker, but my code runs
    def Process(self, *args, **kwargs):
        process = multiprocessing.context.ForkProcess(*args, **kwargs)
        process.run = work
        return process

def attempt(what, action):
    try:
        print(what, "allowed", action(), flush=True)
    except Exception as error:
        print(what, "refused:", " ".join(str(error).split())[:3000], flush=True)

def labels(**options):
    return [y.tolist() for _, y in DataLoader(data, batch_size=4, **options)]

def start(process):
    process.start()
    process.join()

attempt("workers", lambda: labels(num_workers=2))
attempt("pinned", lambda: labels(num_workers=2, pin_memory=True))
attempt("persistent", lambda: labels(num_workers=2, persistent_workers=True))
attempt("worker_forks", lambda: list(DataLoader(Forks(), num_workers=1)))
attempt("worker_connects", lambda: list(DataLoader(Connects(), num_workers=1)))
attempt("process", lambda: start(multiprocessing.Process(target=work)))
attempt("fork_process", lambda: start(multiprocessing.get_context("fork").Process(target=work)))
loop = torch.utils.data._utils.worker._worker_loop  # torch's worker, started by my own code
attempt("worker_loop", lambda: start(multiprocessing.Process(target=loop)))
attempt("my_context", lambda: labels(num_workers=1, multiprocessing_context=MyContext()))
attempt("my_run", lambda: labels(num_workers=1, multiprocessing_context=MyRun(), timeout=30))
attempt("spawn_loader", lambda: labels(num_workers=1, multiprocessing_context="spawn"))
attempt("spawn_process", lambda: start(multiprocessing.get_context("spawn").Process(target=work)))
def again():
    del sys.modules["_posixsubprocess"]
    import _posixsubprocess
attempt("reimport", again)
def unix(address):
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(address)
    os.remove(address)
attempt("unix_elsewhere", lambda: unix(str(Path(sys.argv[1]).parent / "elsewhere.sock")))
attempt("unix_dev", lambda: unix(f"/dev/shm/grader-test-{os.getpid()}.sock"))
attempt("unix_abstract", lambda: unix("\\0grader-test"))
"""


@pytest.fixture(scope="module")
def loaders(tmp_path_factory) -> dict[str, str]:
    scratch = tmp_path_factory.mktemp("scratch")
    (scratch / "tmp").mkdir()
    proc = subprocess.run(  # the temporary folder inside the scratch one, as a child's is
        [sys.executable, "-c", LOADERS, str(scratch)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(scratch / "tmp")},
    )
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


BATCHES = "[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]"


@pytest.mark.parametrize("loader", ["workers", "pinned", "persistent"])
def test_a_dataloaders_own_workers_start_and_load_every_batch(loaders, loader):
    assert loaders[loader] == f"allowed {BATCHES}"


@pytest.mark.parametrize(("what", "why"), [("worker_forks", "starting processes"),
                                           ("worker_connects", "network use")])  # fmt: skip
def test_a_worker_is_fenced_like_its_parent(loaders, what, why):
    # (the worker started, and its own attempt was refused there: torch names the worker)
    assert loaders[what].startswith("refused: Caught Fenced in DataLoader worker process 0")
    assert f"{why} is not allowed while grading" in loaders[what]


@pytest.mark.parametrize(
    "what",
    [
        "process",
        "fork_process",
        "my_context",
        "my_run",
        "worker_loop",
        "spawn_loader",
        "spawn_process",
        "reimport",
    ],
)
def test_student_code_still_cannot_start_processes_of_its_own(loaders, what):
    assert loaders[what].startswith("refused: starting processes is not allowed while grading")


def test_a_loader_refused_its_start_method_is_told_what_to_use_instead(loaders):
    assert "multiprocessing_context unset" in loaders["spawn_loader"]
    assert "num_workers=0" in loaders["spawn_loader"]


@pytest.mark.parametrize("what", ["unix_elsewhere", "unix_abstract", "unix_dev"])
def test_unix_sockets_outside_the_childs_own_folders_stay_refused(loaders, what):
    assert loaders[what] == "refused: network use is not allowed while grading"


# A rank of a pool (grader.ranks) after a run that leaves a DataLoader's workers alive: what
# `unchanged` says of it (each line: when, then whether the rank may serve again).
KEPT_WORKERS = """
import multiprocessing, time, torch
from torch.utils.data import DataLoader, TensorDataset
from grader.ranks.pools import unchanged
may_serve = unchanged()()
print("fresh", may_serve())
kept = iter(DataLoader(TensorDataset(torch.arange(4)), num_workers=2, persistent_workers=True))
next(kept)
# (the loader's own threads counted in as the rank's: of what it left, only its workers differ)
with_threads = unchanged()()
print("kept", with_threads())
multiprocessing.process._children.clear()  # (what multiprocessing knows of them, forgotten)
print("forgotten", with_threads())
kept._shutdown_workers()
for _ in range(100):  # (the queues' feeder threads end a moment after the workers)
    if may_serve():
        break
    time.sleep(0.05)
print("ended", may_serve())
"""


def test_a_rank_whose_run_left_a_loaders_workers_alive_serves_no_more():
    proc = subprocess.run(
        [sys.executable, "-c", KEPT_WORKERS], capture_output=True, text=True, timeout=300
    )
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines == {"fresh": "True", "kept": "False", "forgotten": "False", "ended": "True"}, (
        proc.stderr[-2000:]
    )
