"""A class on JupyterHub, for real: hub/jupyterhub_config.py started on free ports, two students
of a class list logging in through NativeAuthenticator, each lab started by the process
spawner. Run by root, each lab runs under a system account of its own, made by the hub.

The container spawner (DockerSpawner on podman's socket) needs the lab image: `make images`
tests it (tests/test_images.py)."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from grader.judge.registry import assignment_points
from grader.manifest import load_manifest
from hub import running
from hub.closed import closed_on_the_way
from hub.lab_hub import remove_account

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow
STUDENTS = ["ann", "bo"]
NOTEBOOKS = set(load_manifest().notebooks)
# A right try_gpu and its check, as a student runs them in their lab.
A_RIGHT_TRY_GPU_CHECKED = (
    "import torch\nfrom grader import check\n"
    "def try_gpu(i=0):\n"
    "    return torch.device(f'cuda:{i}') if torch.cuda.device_count() > i else "
    "torch.device('cpu')\n"
    "check('try_gpu', try_gpu)\n"
)


def lent_python(homes: Path) -> str:
    """A Python with the lab in it that the students' accounts may run, or a skip that says
    why there is none."""
    python = running.python_for_students(homes / "python")
    if not python:
        pytest.skip(
            f"no Python with the lab in it that other users may run: {sys.executable} lies "
            "in a folder closed to them and the system has no Python "
            f"{sys.version_info.major}.{sys.version_info.minor} that they may run, to make "
            "one from"
        )
    return python


def closed_lab(folder: Path) -> Path:
    """A copy of the lab in `folder` (which other accounts cannot enter), as an instructor's
    clone closed by `chmod 700`, for a hub run by root: that hub refuses to start from an
    open checkout (hub/closed.py), as a clean clone where every account may read is. The
    copy is set up as this checkout is."""
    from tests.test_readme import copy_of_the_lab

    if closed_on_the_way(folder) is None:
        raise RuntimeError(f"{folder} is open to other accounts: it cannot close a copy")
    return set_up(copy_of_the_lab(folder / "lab"))


def set_up(lab: Path) -> Path:
    """Give a copy of the lab what `make setup` and `make hub-setup` leave in a clone beside
    its virtual environment: the compiled messages, and the hub's proxy (this checkout's)."""
    shutil.copytree(REPO / "labtext" / "locale", lab / "labtext" / "locale", dirs_exist_ok=True)
    (lab / "hub" / "node_modules").symlink_to(REPO / "hub" / "node_modules")
    return lab


def edit_first_cell(user, path: str, mark: str) -> None:
    """Put `mark` at the top of the first cell of the notebook at `path` in `user`'s lab."""
    notebook = user.lab_api("GET", path).json()["content"]
    notebook["cells"][0]["source"] = mark + "".join(notebook["cells"][0]["source"])
    saved = user.lab_api("PUT", path, data=json.dumps({"type": "notebook", "content": notebook}))
    assert saved.status_code == 200, saved.text


def started_hub(tmp_path_factory, **extra: str):
    """A hub of the class STUDENTS whose labs are processes, stopped and cleaned up after."""
    if why := running.hub_lacks():
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("hub")
    homes = running.temporary_homes()
    prefix = f"t{secrets.token_hex(2)}-"
    settings = {"HUB_SPAWNER": "process", "HUB_HOMES": str(homes), "HUB_USER_PREFIX": prefix}
    settings.update(extra)
    if os.geteuid() == 0:
        settings["HUB_PYTHON"] = lent_python(homes)
    hub = running.Hub(folder, STUDENTS, lab=closed_lab(folder), **settings)
    try:  # (a hub that does not start leaves neither its accounts nor its homes)
        hub.start()
        yield hub
    finally:
        hub.stop()
        if os.geteuid() == 0:
            for name in STUDENTS:
                remove_account(prefix + name)
        shutil.rmtree(homes, ignore_errors=True)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from started_hub(tmp_path_factory)


@pytest.fixture(scope="module")
def labs(hub):
    """Both students logged in, their labs started."""
    users = {name: hub.login(name) for name in STUDENTS}
    for user in users.values():
        user.start_lab()
    return users


def names_in(listing) -> set[str]:
    return {item["name"] for item in listing.json()["content"]}


def test_the_class_list_gives_each_student_an_account_and_nobody_else(hub):
    passwords = (hub.state / "passwords.csv").read_text()
    assert {"instructor", "ann", "bo"} == {
        line.split(",")[0] for line in passwords.splitlines()[1:]
    }
    assert (hub.state / "passwords.csv").stat().st_mode & 0o077 == 0
    with pytest.raises(PermissionError):
        hub.login("ann", "not-" + hub.password("ann"))
    with pytest.raises(PermissionError):
        hub.login("mallory", "correct-horse-battery")


def test_a_stranger_who_signs_up_waits_for_the_instructor(hub):
    stranger = requests.Session()
    stranger.get(hub.base + "/hub/signup", timeout=10)
    form = {"username": "eve", "signup_password": "a-long-pass-9",
            "signup_password_confirmation": "a-long-pass-9",
            "_xsrf": stranger.cookies.get("_xsrf", path="/hub/")}  # fmt: skip
    signed = stranger.post(hub.base + "/hub/signup", data=form, timeout=10)
    assert "sent to the admin" in signed.text, signed.text[-800:]
    with pytest.raises(PermissionError):
        hub.login("eve", "a-long-pass-9")
    instructor = hub.login("instructor")
    authorize = instructor.session.get(hub.base + "/hub/authorize/eve", timeout=10)
    assert authorize.status_code == 200
    assert hub.login("eve", "a-long-pass-9")


def test_each_student_sees_their_own_work_folder_with_the_notebooks(hub, labs):
    for name, user in labs.items():
        assert names_in(user.lab_api("GET", "/contents")) == {"multigpu"}, name
        assert names_in(user.lab_api("GET", "/contents/multigpu")) == NOTEBOOKS, name
    servers = hub.login("instructor").hub_api("GET", "/users").json()
    ready = {u["name"] for u in servers if u["servers"].get("", {}).get("ready")}
    assert ready == set(STUDENTS)


def test_a_student_cannot_reach_anothers_lab(labs):
    ann, bo = labs["ann"], labs["bo"]
    answer = ann.session.get(bo.lab + "/api/contents/multigpu", timeout=30)
    assert answer.status_code in (403, 404) and "from_scratch" not in answer.text
    assert ann.hub_api("GET", "/users/bo").status_code in (403, 404)
    assert ann.hub_api("DELETE", "/users/bo/server").status_code in (403, 404)
    if os.geteuid() == 0:  # nor, from a terminal or kernel of their lab, bo's files
        bo_home = Path(ann.hub.env["HUB_HOMES"]) / (ann.hub.env["HUB_USER_PREFIX"] + "bo")
        said = ann.run(f"import os\ntry:\n    print(os.listdir({str(bo_home)!r}))\n"
                       "except PermissionError:\n    print('refused')\n")  # fmt: skip
        assert said.strip() == "refused", said


def test_a_check_runs_inside_a_students_lab(labs):
    said = labs["ann"].run(A_RIGHT_TRY_GPU_CHECKED)
    assert "try_gpu" in said and "Traceback" not in said, said
    assert "2 of 2 public checks passed" in said, said


def test_a_restart_keeps_a_students_edits(labs):
    ann = labs["ann"]
    path = "/contents/multigpu/from_scratch.ipynb"
    edit_first_cell(ann, path, "# ann was here\n")
    ann.stop_lab()
    ann.start_lab()
    again = ann.lab_api("GET", path).json()["content"]
    assert "".join(again["cells"][0]["source"]).startswith("# ann was here")
    assert names_in(ann.lab_api("GET", "/contents/multigpu")) == NOTEBOOKS


def notebooks_shell_line(notebook: Path, command: str) -> str:
    """The line of the notebook's shell examples that starts with `command`."""
    cells = json.loads(notebook.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return next(line for line in text.splitlines() if line.startswith(command + " "))


def test_the_terminal_runs_the_notebooks_torchrun_line_with_the_labs_python(labs):
    """In the Terminal, python, torchrun, jupyter and nbgrader are the lab's (run by root, the
    Python the hub lends, which has none of these commands of its own until the hub writes
    them), and the distributed notebook's torchrun line runs as written on the finished
    notebook."""
    ann = labs["ann"]
    lab_python = ann.run("import sys\nprint(sys.executable)\n").strip()
    shown, status = ann.terminal(
        "echo commands: $(command -v python torchrun jupyter nbgrader)"
        " && python -c 'import sys; print(\"runs\", sys.executable)'"
        " && jupyter troubleshoot | grep -A1 sys.executable && nbgrader --version"
    )
    assert status == 0, shown
    found = [Path(p) for p in shown.rsplit("commands: ", 1)[1].splitlines()[0].split()]
    assert [p.name for p in found] == ["python", "torchrun", "jupyter", "nbgrader"], shown
    assert len({p.parent for p in found}) == 1, shown  # start-lab's, first on PATH
    assert f"runs {lab_python}" in shown, shown
    assert f"sys.executable:\n\t{lab_python}" in shown, shown  # jupyter and its subcommands
    assert "nbgrader version" in shown, shown

    assignment = load_manifest().assignment
    line = notebooks_shell_line(REPO / "exercises" / assignment / "distributed.ipynb", "torchrun")
    finished = json.loads((REPO / "solutions" / assignment / "distributed.ipynb").read_text())
    for user in labs.values():
        saved = user.lab_api("PUT", f"/contents/{assignment}/distributed.ipynb",
                             data=json.dumps({"type": "notebook", "content": finished}))  # fmt: skip
        assert saved.status_code == 200, saved.text
    # Both students at once, as in a class: on one machine, with no --master-port, torchrun
    # meets on a free port, so neither run stops the other. On the embedded sample's first
    # images.
    quick = "DPLAB_OFFLINE=1 DPLAB_DATA_LIMIT=512,256"
    with ThreadPoolExecutor(2) as pool:
        runs = pool.map(lambda user: user.terminal(f"cd {assignment} && {quick} {line}", 600),
                        labs.values())  # fmt: skip
        for shown, status in runs:
            assert status == 0, shown
            assert "test acc: " in shown and "on 2 processes (" in shown, shown


def test_an_idle_lab_is_stopped_and_its_work_kept(tmp_path_factory):
    for hub in started_hub(tmp_path_factory, HUB_IDLE_TIMEOUT="10"):
        ann = hub.login("ann")
        ann.start_lab()
        deadline = time.monotonic() + 90
        while ann.hub_api("GET", "/users/ann").json().get("servers"):
            assert time.monotonic() < deadline, "the idle culler left ann's lab running"
            time.sleep(2)
        assert "DELETE /hub/api/users/ann/server (idle-culler@" in hub.log_text()
        ann.start_lab()
        assert names_in(ann.lab_api("GET", "/contents/multigpu")) == NOTEBOOKS


def test_the_exchange_takes_the_notebooks_from_release_to_grades(tmp_path_factory, tmp_path):
    """The instructor releases with nbgrader, each student fetches and submits in their lab's
    Assignments tab, the instructor collects and grades with the lab's grader."""
    from tests.nbgrader_course import nbgrader

    shared = running.temporary_homes()
    exchange = f"--Exchange.root={shared / 'exchange'}"
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", course)
    shutil.copytree(REPO / "solutions" / "multigpu", course / "solutions" / "multigpu")
    nbgrader(course, "generate_assignment", "multigpu", "--force")
    try:
        for hub in started_hub(tmp_path_factory, HUB_EXCHANGE=str(shared / "exchange")):
            nbgrader(course, "release_assignment", "multigpu", exchange)
            users = {name: hub.login(name) for name in STUDENTS}
            for user in users.values():
                user.start_lab()
                assert names_in(user.lab_api("GET", "/contents")) == set(), "copied, not fetched"
                course_id = {"course_id": "multigpu-lab"}
                listed = user.in_lab("GET", "/assignments", params=course_id).json()
                assert [(a["assignment_id"], a["status"]) for a in listed["value"]] == [
                    ("multigpu", "released")
                ], listed
                fetched = user.in_lab("POST", "/assignments/fetch",
                                      data=course_id | {"assignment_id": "multigpu"})  # fmt: skip
                assert fetched.status_code == 200, fetched.text
                assert names_in(user.lab_api("GET", "/contents/multigpu")) == NOTEBOOKS
            for notebook in NOTEBOOKS:  # ann does the work: the reference solutions
                content = json.loads((REPO / "solutions" / "multigpu" / notebook).read_text())
                saved = users["ann"].lab_api("PUT", f"/contents/multigpu/{notebook}",
                                             data=json.dumps({"type": "notebook",
                                                              "content": content}))  # fmt: skip
                assert saved.status_code == 200, saved.text
            for user in users.values():  # bo hands in the stubs as they came
                submitted = user.in_lab("POST", "/assignments/submit",
                                        data=course_id | {"assignment_id": "multigpu"})  # fmt: skip
                assert submitted.status_code == 200 and '"success": false' not in submitted.text
            nbgrader(course, "collect", "multigpu", exchange)
            assert {p.parent.parent.name for p in course.glob("submitted/*/multigpu/*.ipynb")} == {
                "ann", "bo"
            }  # fmt: skip
            graded = subprocess.run(
                [sys.executable, "-m", "grader", "grade", "submitted", "--gradebook",
                 "gradebook.db"], cwd=course, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert graded.returncode == 0, graded.stdout + graded.stderr
            full = f"{assignment_points():g}"
            said = graded.stdout
            assert f"ann: {full}/{full}" in said and f"bo: 0/{full}" in said, said
    finally:
        shutil.rmtree(shared, ignore_errors=True)
