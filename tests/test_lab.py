"""`make lab`'s start command serves the exercises in a real JupyterLab."""

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from grader.manifest import REPO, load_manifest

TOKEN = "test-token-1234"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Lab:
    """JupyterLab started by the lab's start command (or by `make lab`), on a free port."""

    def __init__(self, work, port, command=None, **settings: str):
        self.work, self.port = work, port
        self.base = f"http://127.0.0.1:{port}"
        env = dict(
            os.environ,
            LAB_PYTHON=sys.executable,
            LAB_EXERCISES=str(REPO / "exercises"),
            LAB_WORK=str(work),
            LAB_PORT=str(port),
            JUPYTER_TOKEN=TOKEN,
            JUPYTER_RUNTIME_DIR=str(work.parent / "runtime"),
            TMPDIR=str(work.parent),  # start-lab's Terminal folder, removed with the test's
            **settings,
        )
        self.proc = subprocess.Popen(
            command or [str(REPO / "docker" / "start-lab")],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the lab exited early:\n{self.proc.stdout.read()}")
            try:
                if get(f"{self.base}/api/status?token={TOKEN}")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        raise AssertionError("JupyterLab did not answer within 90 s")

    def stop(self) -> tuple[int, str]:
        request = urllib.request.Request(f"{self.base}/api/shutdown?token={TOKEN}", method="POST")
        urllib.request.urlopen(request, timeout=10)
        out, _ = self.proc.communicate(timeout=30)
        return self.proc.returncode, out


def errors_in(log: str) -> list[str]:
    """Return the lines that JupyterLab logged as errors (`[E 2025-... ServerApp] ...`)."""
    return [line for line in log.splitlines() if line.startswith("[E ")]


@pytest.fixture
def lab(tmp_path):
    running = Lab(tmp_path / "work", free_port())
    yield running
    if running.proc.poll() is None:
        running.proc.kill()
        running.proc.wait()


@pytest.mark.slow
def test_lab_answers_with_the_token_and_refuses_without(lab):
    assert get(f"{lab.base}/api/status?token={TOKEN}")[0] == 200
    assert get(f"{lab.base}/api/status")[0] == 403
    assert get(f"{lab.base}/lab?token={TOKEN}")[0] == 200


@pytest.mark.slow
def test_lab_serves_the_exercise_notebooks(lab):
    assignment = load_manifest().assignment
    status, body = get(f"{lab.base}/api/contents/{assignment}?token={TOKEN}")
    assert status == 200
    names = sorted(item["name"] for item in json.loads(body)["content"])
    assert names == sorted(load_manifest().notebooks)
    status, body = get(f"{lab.base}/api/contents/{assignment}/from_scratch.ipynb?token={TOKEN}")
    cells = json.loads(body)["content"]["cells"]
    assert any("raise NotImplementedError" in c["source"] for c in cells)


@pytest.mark.slow
def test_lab_prints_the_url_and_shuts_down_cleanly(lab):
    assert get(f"{lab.base}/lab?token={TOKEN}")[0] == 200  # the page a student opens
    code, out = lab.stop()
    assert code == 0
    assert f"open http://127.0.0.1:{lab.port}/lab?token={TOKEN}" in out
    assert f"your work is saved in {lab.work}" in out
    assert errors_in(out) == [], out


@pytest.mark.slow
def test_the_students_lab_leaves_nbgrader_out(lab):
    """nbgrader's extensions, where installed, are the instructor's: the lab turns them off."""
    status, page = get(f"{lab.base}/lab?token={TOKEN}")
    assert status == 200
    assert get(f"{lab.base}/formgrader?token={TOKEN}")[0] == 404
    code, out = lab.stop()
    assert "nbgrader" not in out
    if importlib.util.find_spec("nbgrader") is not None:
        assert b'"disabledExtensions": ["@jupyter/nbgrader"' in page


ANNOUNCEMENTS = "@jupyterlab/apputils-extension:announcements"


def page_config(page: bytes) -> dict:
    """The settings JupyterLab's page hands its front end (its jupyter-config-data)."""
    found = re.search(rb'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                      page, re.DOTALL)  # fmt: skip
    assert found, page[:2000]
    return json.loads(found.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("exchange", [False, True], ids=["alone", "with-an-exchange"])
def test_the_lab_does_not_ask_to_fetch_jupyters_news(tmp_path, exchange):
    """JupyterLab's "Jupyter news?" pop-up (its announcements plugin) greets no student: it
    is off in the lab, alone or with a hub's exchange (lab-config-exchange/)."""
    settings = {"LAB_EXCHANGE": str(tmp_path / "exchange")} if exchange else {}
    lab = Lab(tmp_path / "work", free_port(), **settings)
    try:
        status, page = get(f"{lab.base}/lab?token={TOKEN}")
        assert status == 200
        disabled = page_config(page)["disabledExtensions"]
        assert ANNOUNCEMENTS in disabled, disabled
        assert ("@jupyter/nbgrader" in disabled) == (not exchange), disabled
    finally:
        code, out = lab.stop()
    assert code == 0 and errors_in(out) == [], out


def folders_of_children(pid: int) -> list[Path]:
    """Return the working folder of each child process of `pid` (from /proc)."""
    folders = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent == pid:
                folders.append((stat.parent / "cwd").resolve())
        except (OSError, IndexError, ValueError):
            pass  # it ended meanwhile
    return folders


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="reads /proc (Linux)")
def test_a_terminal_opens_in_the_work_folder(lab):
    """A Terminal opened from the top of JupyterLab's file browser names no folder, so it
    starts where the server runs: the work folder, where the README's shell commands run."""
    request = urllib.request.Request(f"{lab.base}/api/terminals?token={TOKEN}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        name = json.loads(response.read())["name"]
    try:
        deadline = time.monotonic() + 60  # a wait for the shell, not a timing
        while lab.work.resolve() not in folders_of_children(lab.proc.pid):
            assert time.monotonic() < deadline, folders_of_children(lab.proc.pid)
            time.sleep(0.2)
    finally:
        delete = f"{lab.base}/api/terminals/{name}?token={TOKEN}"
        urllib.request.urlopen(urllib.request.Request(delete, method="DELETE"), timeout=10)


@pytest.mark.slow
def test_a_restart_keeps_the_students_work(tmp_path):
    work = tmp_path / "work"
    first = Lab(work, free_port())
    first.stop()
    notebook = work / load_manifest().assignment / "from_scratch.ipynb"
    notebook.write_text(notebook.read_text().replace("YOUR CODE HERE", "MY OWN CODE"))
    second = Lab(work, free_port())
    try:
        assert "MY OWN CODE" in notebook.read_text()
    finally:
        second.stop()


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("make") is None or not (REPO / ".venv").is_dir(),
    reason="make lab uses the virtual environment; in the container everything is installed",
)
def test_make_lab_serves_the_exercises(tmp_path):
    port = free_port()
    lab = Lab(tmp_path / "work", port, ["make", "-s", "lab", f"PORT={port}"])
    try:
        status, body = get(f"{lab.base}/api/contents/{load_manifest().assignment}?token={TOKEN}")
        assert status == 200
        assert len(json.loads(body)["content"]) == len(load_manifest().notebooks)
        assert get(f"{lab.base}/lab?token={TOKEN}")[0] == 200
    finally:
        code, out = lab.stop()
    assert code == 0, out
    assert f"open http://127.0.0.1:{port}/lab?token={TOKEN}" in out
    assert errors_in(out) == [], out


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("make") is None or not (REPO / ".venv").is_dir(),
    reason="make lab uses the virtual environment; in the container everything is installed",
)
def test_make_lab_in_chinese_serves_the_chinese_lab(tmp_path):
    """`make lab LANG=zh_CN`: the Chinese notebooks, and JupyterLab's own menus in Chinese
    (its language pack installed, and Chinese the default of its language setting)."""
    port = free_port()
    lab = Lab(tmp_path / "work", port, ["make", "-s", "lab", f"PORT={port}", "LANG=zh_CN"])
    try:
        assignment = load_manifest().assignment
        status, body = get(f"{lab.base}/api/contents/{assignment}/concise.ipynb?token={TOKEN}")
        assert status == 200
        notebook = json.loads(body)["content"]
        assert notebook["metadata"]["lab"]["language"] == "zh_CN"
        assert any("写好这个函数" in c["source"] for c in notebook["cells"])
        plugin = "@jupyterlab/translation-extension:plugin"
        status, body = get(f"{lab.base}/lab/api/settings/{plugin}?token={TOKEN}")
        assert status == 200
        assert json.loads(body)["schema"]["properties"]["locale"]["default"] == "zh_CN"
        status, body = get(f"{lab.base}/lab/api/translations/zh_CN?token={TOKEN}")
        menus = json.dumps(json.loads(body)["data"], ensure_ascii=False)
        assert status == 200 and "文件" in menus  # the File menu, from the language pack
    finally:
        code, out = lab.stop()
    assert code == 0, out
    assert errors_in(out) == [], out


def test_start_command_refuses_a_missing_exercises_folder(tmp_path):
    proc = subprocess.run(
        [str(REPO / "docker" / "start-lab")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, LAB_EXERCISES=str(tmp_path / "none")),
    )
    assert proc.returncode == 2
    assert "no exercises at" in proc.stderr


def test_the_chinese_lab_copies_the_chinese_notebooks_alone(tmp_path):
    """LAB_LANG=zh_CN (make lab LANG=zh_CN) copies exercises/zh_CN/; the English lab leaves
    that folder out of the work folder. (`true` stands in for JupyterLab: only the copying
    is looked at.)"""
    for lang, work in (("zh_CN", tmp_path / "zh"), ("", tmp_path / "en")):
        proc = subprocess.run(
            [str(REPO / "docker" / "start-lab")],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=dict(os.environ, LAB_LANG=lang, LAB_WORK=str(work), LAB_PYTHON="true"),
        )
        copied = sorted(p.relative_to(work).as_posix() for p in work.rglob("*.ipynb"))
        assert copied == [
            f"{load_manifest().assignment}/{n}" for n in sorted(load_manifest().notebooks)
        ], proc.stderr
        text = (work / load_manifest().assignment / "concise.ipynb").read_text()
        assert ("写好这个函数" in text) == (lang == "zh_CN")
    proc = subprocess.run(
        [str(REPO / "docker" / "start-lab")],
        cwd=REPO, capture_output=True, text=True,
        env=dict(os.environ, LAB_LANG="fr_FR", LAB_WORK=str(tmp_path / "fr"), LAB_PYTHON="true"),
    )  # fmt: skip
    assert proc.returncode == 2 and "the languages are: zh_CN" in proc.stderr


def test_the_chinese_lab_says_when_no_font_can_draw_chinese(tmp_path):
    """Without a font that has Chinese glyphs, the plots' Chinese labels would be boxes: the
    Chinese lab says so at start, and what to install. (The Python here stands in for one
    whose dplab finds no such font.)"""
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\ncase "$*" in *chinese_fonts*) exit 1;; esac\nexit 0\n')
    python.chmod(0o755)
    for lang, warned in (("zh_CN", True), ("", False)):
        proc = subprocess.run(
            [str(REPO / "docker" / "start-lab")],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=dict(
                os.environ,
                LAB_LANG=lang,
                LAB_WORK=str(tmp_path / f"w{lang}"),
                LAB_PYTHON=str(python),
            ),
        )
        assert ("fonts-wqy-microhei" in proc.stderr) == warned, proc.stderr


# Stands in for the lab's server: types COMMAND into a shell started as the lab's Terminal
# starts one (start-lab's terminado_settings), and exits with its status.
TERMINAL = """
import json, os, subprocess, sys
setting = next(a for a in sys.argv if a.startswith("--ServerApp.terminado_settings="))
shell = json.loads(setting.split("shell_command=", 1)[1])
sys.exit(subprocess.run([*shell, "-c", os.environ["COMMAND"]]).returncode)
"""
SAYS_WHICH_PYTHON = "import sys; print('runs', sys.executable)\n"


@pytest.mark.parametrize("own_commands", [True, False], ids=["a-venv", "a-bare-python"])
def test_the_terminal_has_the_labs_python_torchrun_jupyter_and_nbgrader(tmp_path, own_commands):
    """Whatever the login files set PATH to, the Terminal's python, torchrun, jupyter and
    nbgrader run the lab's Python: a virtual environment's own commands, or, for a Python
    whose folder has none (as the one a hub lends), the Python with -m. (A stand-in serves
    the lab: only the Terminal is looked at.)"""
    python = Path(sys.executable)
    if not own_commands:  # a Python in a folder of its own, with no commands beside it
        (tmp_path / "bare").mkdir()
        python = tmp_path / "bare" / "python"
        python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        python.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("PATH=/usr/bin:/bin\n")  # as Debian's /etc/profile does
    (tmp_path / "server.py").write_text(TERMINAL)
    (tmp_path / "which.py").write_text(SAYS_WHICH_PYTHON)
    command = (
        "echo commands: $(command -v python torchrun jupyter nbgrader) && python which.py"
        " && torchrun --standalone --nproc-per-node 1 which.py"
        " && jupyter troubleshoot | grep -A1 sys.executable && nbgrader --version"
    )
    proc = subprocess.run(
        [str(REPO / "docker" / "start-lab")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, HOME=str(home), TMPDIR=str(tmp_path), LAB_PYTHON=str(python),
                 LAB_WORK=str(tmp_path / "work"), JUPYTERHUB_API_TOKEN="stand-in",
                 LAB_SINGLEUSER=f"{sys.executable} {tmp_path / 'server.py'}",
                 COMMAND=f"cd {tmp_path} && {command}"),
    )  # fmt: skip
    said = proc.stdout
    assert proc.returncode == 0, said + proc.stderr
    found = [Path(p) for p in said.split("commands:", 1)[1].splitlines()[0].split()]
    assert [p.name for p in found] == ["python", "torchrun", "jupyter", "nbgrader"], said
    assert len({p.parent for p in found}) == 1, said  # start-lab's, first on PATH
    assert said.count(f"runs {sys.executable}") == 2, said  # python, and torchrun's process
    assert f"sys.executable:\n\t{sys.executable}" in said, said  # jupyter and its subcommands
    assert "nbgrader version" in said, said
