"""A submission carries the hub's name for its student and no other.

nbgrader's exchange lets any student's account write into the course's inbound folder, under any
name: dan's `nbgrader submit multigpu --student=carol`, handed in after carol's own, was collected
as carol's (0 for her full marks), and nbgrader's only sign, 'cheating attempt?', was printed
for every honest submission too. Now dan's lab refuses such a submit, and where he gets around
it, the instructor's collect (hub/lab_exchange.py) sets the forgery aside under dan's name, says
so in one line, and takes carol's own; honest submissions pass without a word.
"""

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.front.grade_class import expand
from grader.judge.registry import assignment_points
from grader.load.submission import SET_ASIDE, set_aside_beside
from grader.manifest import load_manifest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hub"))

import running  # noqa: E402
from lab_hub import open_exchange, remove_account  # noqa: E402

NBGRADER = [sys.executable, "-m", "nbgrader"]
COURSE = "multigpu-lab"
ASSIGNMENT = "multigpu"
NOTEBOOK = "concise.ipynb"  # one of the lab's notebooks, so that the grader takes the folders
# nbgrader's submit, without the refusal that a student's lab adds (what dan gets around)
PLAIN_SUBMIT = "--ExchangeFactory.submit=nbgrader.exchange.default.submit.ExchangeSubmit"
# nbgrader runs alembic, beside this Python
ENV = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", LAB_LANG="en")
FORGED = "dan's account handed in multigpu as carol: set aside in "
NBGRADER_WARNING = "cheating attempt"


# dan's Terminal, played in a kernel of his lab: the submit as carol that his lab refuses, then
# nbgrader's plain one
DAN_AS_CAROL = f"""
import json, subprocess, sys
for extra in ([], [{PLAIN_SUBMIT!r}]):
    p = subprocess.run([sys.executable, "-m", "nbgrader", "submit", {ASSIGNMENT!r},
                        "--CourseDirectory.student_id=carol", *extra],
                       capture_output=True, text=True)
    print(json.dumps([p.returncode, p.stderr]))
"""


def notebook(mark: str) -> str:
    cell = {"cell_type": "markdown", "metadata": {}, "source": mark}
    return json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def released_exchange(root: Path) -> Path:
    """An exchange with the assignment released into it, as nbgrader's release leaves it."""
    open_exchange(str(root))
    course = root / COURSE
    (course / "outbound" / ASSIGNMENT).mkdir(parents=True)
    (course / "outbound" / ASSIGNMENT / NOTEBOOK).write_text(notebook("released"))
    (course / "inbound").mkdir()
    course.chmod(0o755)
    (course / "inbound").chmod(0o733)  # anyone may hand in, nobody but its owner list
    subprocess.run(["chmod", "-R", "a+rX", str(course / "outbound")], check=True)
    return root


def lines_with(text: str, said: str) -> list[str]:
    return [line for line in said.splitlines() if text in line]


def test_a_lab_refuses_to_submit_under_another_students_name(tmp_path):
    exchange = released_exchange(tmp_path / "exchange")
    work = tmp_path / "work"
    (work / ASSIGNMENT).mkdir(parents=True)
    (work / ASSIGNMENT / NOTEBOOK).write_text(notebook("dan's"))
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(REPO / "docker" / "lab-config-exchange"),
               JUPYTERHUB_USER="dan", LAB_EXCHANGE=str(exchange), LAB_LANG="en")  # fmt: skip

    def submit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*NBGRADER, "submit", ASSIGNMENT, *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    for forged in (["--student=carol"], ["--CourseDirectory.student_id=carol"]):
        refused = submit(*forged)
        assert refused.returncode != 0, refused.stderr
        assert (
            "you are dan on this hub: a submission carries your own name, not carol"
            in refused.stderr
        ), refused.stderr
    assert not list((exchange / COURSE / "inbound").iterdir())
    own = submit()
    assert own.returncode == 0, own.stderr
    assert [p.name.split("+")[0] for p in (exchange / COURSE / "inbound").iterdir()] == ["dan"]


@pytest.fixture
def accounts():
    """Two students' accounts, `<prefix>carol` and `<prefix>dan`, as the hub's process spawner
    makes them, with their homes; removed after."""
    if os.geteuid() != 0:
        pytest.skip("making the students' accounts takes root, as the hub's process spawner")
    homes = running.temporary_homes()
    prefix = f"f{secrets.token_hex(2)}-"
    made = []
    try:
        for name in ("carol", "dan"):
            account = prefix + name
            subprocess.run(
                ["useradd", "--create-home", "--home-dir", str(homes / account), "--shell",
                 "/bin/bash", "--user-group", "--no-log-init", account],
                check=True, capture_output=True,
            )  # fmt: skip
            made.append(account)
        yield prefix, homes
    finally:
        for account in made:
            remove_account(account)
        shutil.rmtree(homes, ignore_errors=True)


def test_collect_sets_a_forgery_aside_under_the_name_of_the_account_that_made_it(
    accounts, tmp_path, capsys
):
    prefix, homes = accounts
    python = running.python_for_students(homes / "python")
    if not python:
        pytest.skip("no Python that the students' accounts may run")
    exchange = released_exchange(homes / "exchange")

    def submit(account: str, as_student: str, mark: str) -> None:
        home = homes / account
        (home / ASSIGNMENT).mkdir(exist_ok=True)
        (home / ASSIGNMENT / NOTEBOOK).write_text(notebook(mark))
        shutil.chown(home / ASSIGNMENT / NOTEBOOK, account, account)
        shutil.chown(home / ASSIGNMENT, account, account)
        done = subprocess.run(
            [python, "-m", "nbgrader", "submit", ASSIGNMENT, f"--Exchange.root={exchange}",
             f"--CourseDirectory.course_id={COURSE}", f"--student={as_student}", PLAIN_SUBMIT],
            user=account, group=account, extra_groups=[], cwd=home, capture_output=True,
            text=True, timeout=120, env={"HOME": str(home), "PATH": os.environ["PATH"]},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        time.sleep(0.01)  # (each submission its own time)

    submit(prefix + "carol", "carol", "carol's own")
    submit(prefix + "dan", "dan", "dan's own")
    submit(prefix + "dan", "carol", "dan's, as carol")  # the newest of those named carol
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", course)
    collected = subprocess.run(
        [*NBGRADER, "collect", ASSIGNMENT, f"--Exchange.root={exchange}", "--update"],
        cwd=course, env=dict(ENV, HUB_USER_PREFIX=prefix),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = collected.stdout + collected.stderr
    assert collected.returncode == 0, said
    assert len(lines_with(FORGED, said)) == 1, said
    assert NBGRADER_WARNING not in said and "could not be checked" not in said, said

    def handed_in(folder: Path) -> str:
        return json.loads((folder / NOTEBOOK).read_text())["cells"][0]["source"]

    submitted = course / "submitted"
    assert {p.name for p in submitted.iterdir()} == {"carol", "dan"}
    assert handed_in(submitted / "carol" / ASSIGNMENT) == "carol's own"
    assert handed_in(submitted / "dan" / ASSIGNMENT) == "dan's own"
    [aside] = (course / SET_ASIDE / "dan" / ASSIGNMENT).iterdir()
    assert aside.name.startswith(f"carol+{ASSIGNMENT}+") and handed_in(aside) == "dan's, as carol"
    assert str(aside) in lines_with(FORGED, said)[0]

    # The grader, given nbgrader's submitted/, grades carol's and dan's own, and says again
    # what was set aside.
    assert [line.startswith(FORGED) for line in set_aside_beside(submitted, ASSIGNMENT)] == [True]
    capsys.readouterr()
    assert [s.id for s in expand([submitted], load_manifest())] == ["carol", "dan"]
    assert len(lines_with(FORGED, capsys.readouterr().err)) == 1

    # A submission by an account that is no student's (here root's) cannot be checked: one line.
    shutil.rmtree(submitted)
    work = tmp_path / "root"
    (work / ASSIGNMENT).mkdir(parents=True)
    (work / ASSIGNMENT / NOTEBOOK).write_text(notebook("root's"))
    subprocess.run(
        [*NBGRADER, "submit", ASSIGNMENT, f"--Exchange.root={exchange}",
         f"--CourseDirectory.course_id={COURSE}", "--student=erin"],
        cwd=work, check=True, capture_output=True, env=dict(ENV, HOME=str(work)),
    )  # fmt: skip
    again = subprocess.run(
        [*NBGRADER, "collect", ASSIGNMENT, f"--Exchange.root={exchange}"],
        cwd=course, env=dict(ENV, HUB_USER_PREFIX=prefix),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = again.stdout + again.stderr
    assert again.returncode == 0, said
    assert {p.name for p in submitted.iterdir()} == {"carol", "dan", "erin"}
    assert len(lines_with(FORGED, said)) == 1, said
    assert lines_with("were made by accounts that are no student's lab account (root)", said)


@pytest.mark.slow
def test_a_forgery_through_the_hub_leaves_the_student_it_names_their_grade(
    tmp_path_factory, tmp_path, monkeypatch
):
    """carol hands in the reference solutions in her lab's Assignments tab, dan his stubs in
    his; then, in dan's lab, `nbgrader submit multigpu --CourseDirectory.student_id=carol` is
    refused, and the same with nbgrader's plain submit gets through. After collect and
    grading, carol keeps full marks and the forgery is named under dan."""
    import tests.test_hub as hub_tests
    from tests.nbgrader_course import nbgrader

    monkeypatch.setattr(hub_tests, "STUDENTS", ["carol", "dan"])
    shared = running.temporary_homes()
    exchange = f"--Exchange.root={shared / 'exchange'}"
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", course)
    shutil.copytree(REPO / "solutions" / ASSIGNMENT, course / "solutions" / ASSIGNMENT)
    nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    course_id = {"course_id": COURSE}
    try:
        for hub in hub_tests.started_hub(tmp_path_factory, HUB_EXCHANGE=str(shared / "exchange")):
            nbgrader(course, "release_assignment", ASSIGNMENT, exchange)
            users = {name: hub.login(name) for name in ("carol", "dan")}
            for user in users.values():
                user.start_lab()
                fetched = user.in_lab("POST", "/assignments/fetch",
                                      data=course_id | {"assignment_id": ASSIGNMENT})  # fmt: skip
                assert fetched.status_code == 200, fetched.text
            for name in hub_tests.NOTEBOOKS:  # carol does the work: the reference solutions
                content = json.loads((REPO / "solutions" / ASSIGNMENT / name).read_text())
                saved = users["carol"].lab_api("PUT", f"/contents/{ASSIGNMENT}/{name}",
                                               data=json.dumps({"type": "notebook",
                                                                "content": content}))  # fmt: skip
                assert saved.status_code == 200, saved.text
            for user in users.values():  # dan hands in the stubs as they came, as himself
                submitted = user.in_lab("POST", "/assignments/submit",
                                        data=course_id | {"assignment_id": ASSIGNMENT})  # fmt: skip
                assert submitted.status_code == 200 and '"success": false' not in submitted.text
            said = users["dan"].run(DAN_AS_CAROL)
            (refused, why), (forged, how) = [json.loads(line) for line in said.splitlines()]
            assert refused != 0 and "you are dan on this hub" in why, said
            assert forged == 0, how
            monkeypatch.setenv("HUB_USER_PREFIX", hub.env["HUB_USER_PREFIX"])
            collected = nbgrader(course, "collect", ASSIGNMENT, exchange, "--update")
            told = collected.stdout + collected.stderr
            assert len(lines_with(FORGED, told)) == 1, told
            assert NBGRADER_WARNING not in told and "could not be checked" not in told, told
            assert {p.name for p in (course / "submitted").iterdir()} == {"carol", "dan"}
            assert [p.name[: len("carol+")] for p in
                    (course / SET_ASIDE / "dan" / ASSIGNMENT).iterdir()] == ["carol+"]  # fmt: skip
            graded = subprocess.run(
                [sys.executable, "-m", "grader", "grade", "submitted", "--gradebook",
                 "gradebook.db"], cwd=course, capture_output=True, text=True, timeout=900,
                env=ENV,
            )  # fmt: skip
            assert graded.returncode == 0, graded.stdout + graded.stderr
            full = f"{assignment_points():g}"
            said = graded.stdout
            assert f"carol: {full}/{full}" in said and f"dan: 0/{full}" in said, said
            assert len(lines_with(FORGED, graded.stderr)) == 1, graded.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)
