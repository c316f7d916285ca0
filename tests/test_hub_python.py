"""The lab's Python under `make hub`: the hub started as `make hub` starts it (no HUB_PYTHON),
whose students' accounts must be able to run that Python wherever the checkout and its .venv
lie; a lab that cannot start, as a student sees it; and the lab's Terminal, whose `python` and
`python3` are the lab's, so that the README's steps work there as written."""

import asyncio
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hub import lab_hub, running
from hub.lab_hub import remove_account
from tests.test_hub import closed_lab

REPO = Path(__file__).resolve().parents[1]

slow = pytest.mark.slow
STUDENTS = ["ann", "bo", "cy"]
ROOT = os.geteuid() == 0
# Where the hub makes the Python it lends, when run by root: outside the checkout.
LENT = "lent-python"


def open_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="lab-python-"))
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub started as `make hub` starts it: the process spawner, no HUB_PYTHON."""
    if why := running.hub_lacks():
        pytest.skip(why)
    homes, python_folder = running.temporary_homes(), open_folder()
    prefix = f"t{secrets.token_hex(2)}-"
    folder = tmp_path_factory.mktemp("hub")
    hub = running.Hub(
        folder, STUDENTS, lab=closed_lab(folder), HUB_SPAWNER="process",
        HUB_HOMES=str(homes), HUB_USER_PREFIX=prefix,
        HUB_PYTHON_FOLDER=str(python_folder / LENT),
    )  # fmt: skip
    hub.env.pop("HUB_PYTHON", None)
    hub.start(timeout=180)
    try:
        yield hub
    finally:
        hub.stop()
        if ROOT:
            for name in STUDENTS:
                remove_account(prefix + name)
        shutil.rmtree(homes, ignore_errors=True)
        shutil.rmtree(python_folder, ignore_errors=True)


@pytest.fixture(scope="module")
def ann(hub):
    user = hub.login("ann")
    user.start_lab()
    return user


def lent_folder(hub) -> Path:
    return Path(hub.env["HUB_PYTHON_FOLDER"])


def account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@slow
@pytest.mark.skipif(not ROOT, reason="run by root, the hub lends its students a Python")
def test_make_hub_lends_the_students_a_python_of_its_own_outside_the_checkout(hub, ann):
    said = ann.run("import sys, grader\nprint(sys.executable)\nprint(grader.__file__)\n")
    executable, grader_file = said.split()
    runs_as_nobody = running._runs_as_nobody(sys.executable)
    if runs_as_nobody:  # the checkout's Python is open to every account: it is the one lent
        assert executable == sys.executable, said
        return
    assert f"made the lab's Python for the students' accounts in {lent_folder(hub)}" in (
        hub.log_text()
    )
    assert Path(executable).is_relative_to(lent_folder(hub)), said
    assert not Path(grader_file).is_relative_to(REPO), "the lab's files come from the lent copy"
    # The hub checked, before it took a login, that an account of no rights could run it.
    probe = subprocess.run([executable, "-c", "import grader, jupyterhub"], user="nobody",
                           group="nogroup", extra_groups=[], cwd="/")  # fmt: skip
    assert probe.returncode == 0
    # Started again, the hub reuses it, as long as the lab and its packages stay the same.
    hub.stop()
    hub.start(timeout=180)
    made_before = Path(executable).parents[1]
    reused = f"reused the lab's Python for the students' accounts, made before in {made_before}"
    assert reused in hub.log_text()
    ann.start_lab()
    assert ann.run("import sys\nprint(sys.executable)\n").strip() == executable


@slow
@pytest.mark.skipif(not ROOT, reason="only root's hub checks its students' accounts")
def test_the_hub_will_not_start_with_a_python_the_students_cannot_run(tmp_path):
    if why := running.hub_lacks():
        pytest.skip(why)
    if running._runs_as_nobody(sys.executable):
        pytest.skip(f"{sys.executable} is open to every account here")
    hub = running.Hub(tmp_path, STUDENTS, lab=closed_lab(tmp_path), HUB_SPAWNER="process",
                      HUB_PYTHON=sys.executable, HUB_HOMES=str(tmp_path / "homes"))  # fmt: skip
    with pytest.raises(RuntimeError, match="the hub stopped at start"):
        hub.start()
    log = hub.log_text()
    assert f"the students' accounts cannot start a lab with {sys.executable}" in log, log
    assert "leave HUB_PYTHON unset" in log and "HUB_PYTHON_FOLDER" in log, log


@slow
def test_the_terminal_has_the_labs_python_as_python_and_python3(ann):
    lab_python = ann.run("import sys\nprint(sys.executable)\n").strip()
    for python in ("python", "python3"):
        shown, status = ann.terminal(
            f"{python} -c 'import grader, sys; print(\"runs\", sys.executable)'"
        )
        assert status == 0, shown
        assert f"runs {lab_python}" in shown, shown


@slow
def test_the_readmes_check_runs_in_the_terminal_as_written(ann):
    # as README.md step 4 has it, in the work folder where the Terminal opens; LAB_PYTHON unset
    shown, status = ann.terminal(
        "unset LAB_PYTHON; python -m grader check multigpu/from_scratch.ipynb --exercise allreduce"
    )
    assert status == 1, shown  # the stub is not written yet
    assert "allreduce" in shown, shown
    assert "✗ book_demo_gives_threes_on_both_devices  0/2" in shown, shown
    assert "`allreduce` is not written yet: it still raises NotImplementedError" in shown, shown


@slow
@pytest.mark.skipif(not ROOT, reason="only root's hub makes accounts")
def test_a_lab_that_cannot_start_tells_the_student_and_leaves_no_account(hub, ann):
    """The lent Python becomes closed to the students' accounts while the hub runs."""
    executable = ann.run("import sys\nprint(sys.executable)\n").strip()
    if not Path(executable).is_relative_to(lent_folder(hub)):
        pytest.skip("the hub lends the checkout's own Python here")
    closed = Path(executable).parents[1]
    account = hub.env["HUB_USER_PREFIX"] + "bo"
    bo = hub.login("bo")
    closed.chmod(0o700)
    try:
        page = bo.session.get(f"{hub.base}/hub/spawn/bo", timeout=60)
        deadline = time.monotonic() + 60
        while "tell your instructor" not in page.text and time.monotonic() < deadline:
            time.sleep(1)  # the progress page, until the start has failed
            page = bo.session.get(f"{hub.base}/hub/spawn-pending/bo", timeout=60)
    finally:
        closed.chmod(0o755)
    assert "Your lab could not start" in page.text, page.text[-2000:]
    assert "please tell your instructor" in page.text, page.text[-2000:]
    assert "Unhandled error" not in page.text
    log = hub.log_text()
    assert f"{account} cannot start a lab with {executable}" in log, log[-3000:]
    assert "HUB_PYTHON_FOLDER" in log  # what the instructor can do about it
    assert not account_exists(account)
    assert not (Path(hub.env["HUB_HOMES"]) / account).exists()
    # With the Python open again, bo's lab starts, in an account made for it then.
    bo.start_lab()
    assert account_exists(account)


@slow
@pytest.mark.skipif(not ROOT, reason="only root's hub makes accounts")
def test_a_lab_that_ends_as_it_starts_tells_the_student_at_once(hub, ann):
    """The lab's start script exits at once: the student learns it without waiting out the
    hub's timeout, the log says which lab ended and how, and the new account goes again."""
    executable = ann.run("import sys\nprint(sys.executable)\n").strip()
    if not Path(executable).is_relative_to(lent_folder(hub)):
        pytest.skip("the hub lends the checkout's own Python here")
    start_lab = Path(executable).parents[1] / "lab" / "docker" / "start-lab"
    kept = start_lab.read_bytes()
    account = hub.env["HUB_USER_PREFIX"] + "cy"
    cy = hub.login("cy")
    start_lab.write_text("#!/bin/sh\necho 'start-lab: a broken lab, for the test' >&2\nexit 3\n")
    began = time.monotonic()
    try:
        page = cy.session.get(f"{hub.base}/hub/spawn/cy", timeout=60)
        while "tell your instructor" not in page.text and time.monotonic() < began + 80:
            time.sleep(1)
            page = cy.session.get(f"{hub.base}/hub/spawn-pending/cy", timeout=60)
        waited = time.monotonic() - began
    finally:
        start_lab.write_bytes(kept)
    assert "Your lab stopped while it was starting (status 3)" in page.text, page.text[-2000:]
    assert "Spawner failed" not in page.text and "Unhandled error" not in page.text
    print(f"the student read why the lab stopped {waited:.1f} s after asking for it")
    log = hub.log_text()
    assert "the lab of cy" in log and "ended with status 3 before it listened" in log, log[-3000:]
    assert "never showed up" not in log  # JupyterHub's own timeout was not what ended it
    assert "start-lab: a broken lab, for the test" in log  # its own output, as the log says
    assert not account_exists(account)
    cy.start_lab()  # mended, it starts
    assert account_exists(account)


# ---- the spawner's own bookkeeping, without a hub ----------------------------------------


@pytest.fixture
def spawner(monkeypatch):
    """A process spawner run by root, whose commands (pkill, userdel) are recorded."""
    ran = []

    def run(args, **kwargs):
        ran.append(args[0])
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(lab_hub.subprocess, "run", run)
    monkeypatch.setattr(lab_hub.LabProcessSpawner, "isolated", True)
    made = lab_hub.LabProcessSpawner(user=SimpleNamespace(name="ann", url="/user/ann/"))
    made.ran = ran
    return made


def test_a_lab_whose_python_the_account_cannot_run_says_so_and_removes_the_new_account(
    spawner, monkeypatch
):
    monkeypatch.setattr(spawner, "_make_account", lambda: True)
    closed = "a folder on the way to it is closed to that account"
    monkeypatch.setattr(lab_hub, "probe_lab_python", lambda python, account: ("", closed))
    with pytest.raises(lab_hub.LabCannotStart) as failed:
        asyncio.run(spawner.start())
    assert failed.value.jupyterhub_message.startswith("Your lab could not start")
    assert "please tell your instructor" in failed.value.jupyterhub_message
    assert closed in str(failed.value) and "HUB_PYTHON_FOLDER" in str(failed.value)
    assert spawner.ran == ["pkill", "userdel"]


def test_an_account_made_before_stays_when_its_lab_cannot_start(spawner, monkeypatch):
    monkeypatch.setattr(spawner, "_make_account", lambda: False)
    monkeypatch.setattr(lab_hub, "probe_lab_python", lambda python, account: ("", "closed"))
    with pytest.raises(lab_hub.LabCannotStart):
        asyncio.run(spawner.start())
    assert spawner.ran == []


@pytest.mark.parametrize("answered", [False, True])
def test_a_new_account_goes_when_its_lab_never_answers_and_stays_once_it_did(spawner, answered):
    loop = asyncio.new_event_loop()
    try:
        spawner._account_made_for_this_start = True  # its start made it, and started the lab
        spawner._spawn_future = loop.create_future()  # the hub waits for the lab to answer
        if answered:
            spawner._spawn_future.set_result(None)
        spawner.run_post_stop_hook()  # the hub stopped it: it gave up on it, or it was done
        assert spawner.ran == ([] if answered else ["pkill", "userdel"])
        spawner.ran.clear()
        spawner._spawn_future = loop.create_future()  # a later start fails before start()
        spawner.run_post_stop_hook()
        assert spawner.ran == [], "an account that was kept once stays"
    finally:
        loop.close()
