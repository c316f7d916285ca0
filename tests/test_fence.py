"""The fence's inner layer, Python's audit hook, holds even where no namespace is allowed."""

import socket
import subprocess
import sys

import pytest

from grader.manifest import REPO
from grader.sandbox.fence import choose_fence, private_paths

SNIPPET = """
import os, socket, sys
from pathlib import Path
from grader.sandbox.fence import install_audit_hook
scratch = Path(sys.argv[1])
install_audit_hook(scratch, [Path(p) for p in sys.argv[2:]])
def attempt(what, action):
    try:
        action()
        print(what, "allowed")
    except PermissionError as error:
        print(what, "refused:", error)
attempt("connect", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
attempt("read", lambda: open(sys.argv[2] + "/allreduce.py").read())
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
    hidden = str(REPO / "grader" / "hidden")
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
    names = {p.name for p in private_paths()}
    assert {"hidden", "mistakes", "multigpu"} <= names


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
    private = [str(REPO / "grader" / "hidden" / "allreduce.py"), str(SOLUTIONS / "concise.ipynb")]
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
