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
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from grader.class_grading import expand
from grader.judge.registry import assignment_points
from grader.load.submission import SET_ASIDE, set_aside_beside
from grader.manifest import load_manifest
from hub import running
from hub.lab_hub import open_exchange, remove_account

REPO = Path(__file__).resolve().parents[1]

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


# carol keeps, in a folder of her own, the notebooks as they were released (none done)
CAROL_KEEPS_A_DRAFT = """
import os, shutil
shutil.copytree({released!r}, "draft")
print(os.path.realpath("draft"))
"""

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


def test_a_submission_made_under_the_hub_is_its_makers_alone(tmp_path):
    """nbgrader opens a submission to every account (its folder 777, its files 644), hidden
    only by a name no one else can list; a lab of the process spawner closes it, and the
    instructor's collect, as root, reads it all the same."""
    exchange = released_exchange(tmp_path / "exchange")
    work = tmp_path / "work"
    (work / ASSIGNMENT).mkdir(parents=True)
    (work / ASSIGNMENT / NOTEBOOK).write_text(notebook("dan's"))
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(REPO / "docker" / "lab-config-exchange"),
               JUPYTERHUB_USER="dan", LAB_EXCHANGE=str(exchange), LAB_LANG="en",
               HUB_USER_PREFIX="lab-")  # fmt: skip
    own = subprocess.run([*NBGRADER, "submit", ASSIGNMENT], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert own.returncode == 0, own.stderr
    [submission] = (exchange / COURSE / "inbound").iterdir()
    modes = {p.relative_to(submission).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in [submission, *submission.rglob("*")]}  # fmt: skip
    assert modes == {".": 0o700, NOTEBOOK: 0o600, "timestamp.txt": 0o600,
                     "submission_secret.txt": 0o600}  # fmt: skip


def test_release_makes_the_inbound_folder_sticky(tmp_path):
    """The instructor's release (LabRelease) sets the sticky bit of the course's inbound
    folder, so that no account renames or removes what another handed in."""
    released = subprocess.run(
        [*NBGRADER, "release_assignment", ASSIGNMENT, f"--Exchange.root={tmp_path / 'ex'}"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert released.returncode == 0, released.stderr
    inbound = tmp_path / "ex" / COURSE / "inbound"
    mode = inbound.stat().st_mode
    assert mode & stat.S_ISVTX and mode & 0o777 == 0o733, oct(mode)


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


def students_python(homes: Path) -> str:
    """A Python the students' accounts may run (running.python_for_students); skips without."""
    python = running.python_for_students(homes / "python")
    if not python:
        pytest.skip("no Python that the students' accounts may run")
    return python


def submit(python: str, exchange: Path, home: Path, as_student: str, mark: str) -> None:
    """nbgrader's plain submit of a notebook saying `mark`, run by the account whose home is
    `home` under the name `as_student`."""
    account = home.name
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


def collect(course: Path, exchange: Path, prefix: str, *args: str) -> str:
    """The instructor's `nbgrader collect` (with this checkout's LabCollect) in `course`; what
    it said."""
    if not (course / "nbgrader_config.py").exists():
        course.mkdir(exist_ok=True)
        shutil.copy(REPO / "nbgrader_config.py", course)
    collected = subprocess.run(
        [*NBGRADER, "collect", ASSIGNMENT, f"--Exchange.root={exchange}", *args],
        cwd=course, env=dict(ENV, HUB_USER_PREFIX=prefix),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = collected.stdout + collected.stderr
    assert collected.returncode == 0, said
    return said


def handed_in(folder: Path) -> str:
    """What the notebook of a submission's folder says."""
    return json.loads((folder / NOTEBOOK).read_text())["cells"][0]["source"]


def test_collect_sets_a_forgery_aside_under_the_name_of_the_account_that_made_it(
    accounts, tmp_path, capsys
):
    prefix, homes = accounts
    python = students_python(homes)
    exchange = released_exchange(homes / "exchange")
    submit(python, exchange, homes / f"{prefix}carol", "carol", "carol's own")
    submit(python, exchange, homes / f"{prefix}dan", "dan", "dan's own")
    # the newest of those named carol
    submit(python, exchange, homes / f"{prefix}dan", "carol", "dan's, as carol")
    course = tmp_path / "course"
    said = collect(course, exchange, prefix, "--update")
    assert len(lines_with(FORGED, said)) == 1, said
    assert NBGRADER_WARNING not in said and "could not be checked" not in said, said

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
    said = collect(course, exchange, prefix)
    assert {p.name for p in submitted.iterdir()} == {"carol", "dan", "erin"}
    assert len(lines_with(FORGED, said)) == 1, said
    assert lines_with("were made by accounts that are no student's lab account (root)", said)


def nbgrader_time(later: float = 60) -> str:
    """A time as nbgrader's submit writes it in a submission's name, `later` seconds from now."""
    when = datetime.now(UTC) + timedelta(seconds=later)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f %Z")


def as_account(account: str, script: str) -> None:
    """Run the shell `script` as `account`, as its student could in their lab's Terminal."""
    done = subprocess.run(["sh", "-c", script], user=account, group=account, extra_groups=[],
                          cwd="/", capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr


def own_folder(dan: str, folder: Path, timestamp: str) -> None:
    """dan makes `folder` of his own in the exchange, looking like a submission (its time)."""
    as_account(dan, f"mkdir '{folder}' && echo '{timestamp}' > '{folder}/timestamp.txt'")


# What dan puts in the exchange's inbound folder, as `folder`, in a name's newest submission:
# through a link, carol's draft (a folder of hers that dan cannot even read) collected for
# her or for him; or what stops nbgrader's copy. Each returns why collect must refuse it.
def link_to_her_folder(dan: str, folder: Path, timestamp: str, draft: Path) -> str:
    as_account(dan, f"ln -s '{draft}' '{folder}'")
    return f"{folder.name} is a symbolic link (to {draft})"


def link_inside(dan: str, folder: Path, timestamp: str, draft: Path) -> str:
    own_folder(dan, folder, timestamp)
    as_account(dan, f"ln -s '{draft / NOTEBOOK}' '{folder / NOTEBOOK}'")
    return f"{folder.name}/{NOTEBOOK} is a symbolic link (to {draft / NOTEBOOK})"


def hard_link_to_her_file(dan: str, folder: Path, timestamp: str, draft: Path) -> str:
    own_folder(dan, folder, timestamp)
    os.link(draft / NOTEBOOK, folder / NOTEBOOK)  # (as root: the kernel's protected_hardlinks
    # stops dan himself where it is on, the default, but not where it is off)
    return f"{folder.name}/{NOTEBOOK} is a hard link to a file of {draft.parent.name}"


def named_pipe(dan: str, folder: Path, timestamp: str, draft: Path) -> str:
    own_folder(dan, folder, timestamp)
    as_account(dan, f"mkfifo '{folder / NOTEBOOK}'")  # (nbgrader's copy stopped at it)
    return f"{folder.name}/{NOTEBOOK} is a named pipe (FIFO)"


def device_file(dan: str, folder: Path, timestamp: str, draft: Path) -> str:
    own_folder(dan, folder, timestamp)
    try:  # /dev/null's; /dev/zero's would have filled the disk
        os.mknod(folder / NOTEBOOK, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError as error:
        pytest.skip(f"making a device file takes the right to (CAP_MKNOD): {error}")
    shutil.chown(folder / NOTEBOOK, dan, dan)
    return f"{folder.name}/{NOTEBOOK} is a device file"


ATTACKS = {  # (the attack, the name it claims)
    "a link to a folder of hers, as carol": (link_to_her_folder, "carol"),
    "a link inside, to her notebook, as dan": (link_inside, "dan"),
    "a link inside, to her notebook, as carol": (link_inside, "carol"),
    "a hard link to her notebook, as dan": (hard_link_to_her_file, "dan"),
    "a named pipe, as carol": (named_pipe, "carol"),
    "a device file, as carol": (device_file, "carol"),
}


def draft_of(home: Path) -> Path:
    """A folder of the student's whose home is `home`, closed to others: an old draft."""
    draft = home / "draft"
    draft.mkdir(mode=0o700)
    (draft / NOTEBOOK).write_text(notebook("carol's draft"))
    (draft / NOTEBOOK).chmod(0o600)
    for made in (draft / NOTEBOOK, draft):
        shutil.chown(made, home.name, home.name)
    return draft


def everything_in(folder: Path) -> list[Path]:
    return [Path(root) / name for root, dirs, files in os.walk(folder) for name in dirs + files]


def honest_submissions(accounts) -> tuple:
    """An exchange with the assignment released and carol's and dan's own submissions in it:
    (the accounts' prefix, their homes, the students' Python, the exchange)."""
    prefix, homes = accounts
    python = students_python(homes)
    exchange = released_exchange(homes / "exchange")
    submit(python, exchange, homes / f"{prefix}carol", "carol", "carol's own")
    submit(python, exchange, homes / f"{prefix}dan", "dan", "dan's own")
    return prefix, homes, python, exchange


@pytest.mark.parametrize("attack", ATTACKS)
def test_collect_refuses_what_is_not_the_makers_own_and_says_why(accounts, tmp_path, attack):
    """dan puts in the exchange, as the newest submission of a name, what only a link, or a
    file that is no file, makes a submission: collect refuses it, sets what it can aside
    without following a link, says in one line who made it, as whom and why, and takes each
    student's own newest honest submission."""
    make, claims = ATTACKS[attack]
    prefix, homes, python, exchange = honest_submissions(accounts)
    carol, dan = f"{prefix}carol", f"{prefix}dan"
    draft = draft_of(homes / carol)
    timestamp = nbgrader_time()
    name = f"{claims}+{ASSIGNMENT}+{timestamp}+{secrets.token_hex(16)}"
    why = make(dan, exchange / COURSE / "inbound" / name, timestamp, draft)

    course = tmp_path / "course"
    said = collect(course, exchange, prefix, "--update")
    aside = course.resolve() / SET_ASIDE / "dan" / ASSIGNMENT / name
    refused = (
        f"dan's account handed in {ASSIGNMENT} as {claims}, refused: {why}; set aside in "
        f"{aside}, not taken as {claims}'s"
    )
    submitted = course / "submitted"
    assert handed_in(submitted / "carol" / ASSIGNMENT) == "carol's own"
    assert handed_in(submitted / "dan" / ASSIGNMENT) == "dan's own"
    [line] = lines_with(f"handed in {ASSIGNMENT}", said)
    assert line.endswith(refused), said
    # set aside without what it refused, and nothing copied through a link
    assert aside.is_dir() and not aside.is_symlink() and not (aside / NOTEBOOK).exists()
    copied = everything_in(course)
    kinds = {p: stat.S_IFMT(p.lstat().st_mode) for p in copied}
    assert [p for p, kind in kinds.items() if kind not in (stat.S_IFDIR, stat.S_IFREG)] == []
    assert [p for p in copied if p.is_file() and b"carol's draft" in p.read_bytes()] == []


def test_collected_work_is_the_instructors_and_closed_to_other_accounts(accounts, tmp_path):
    """nbgrader's submit leaves a submission's folder in the exchange open to every account
    (mode 777); what collect makes of it, collected or set aside, is the collecting account's
    and closed to every other, and so again after a collect that finds it there already."""
    prefix, homes, python, exchange = honest_submissions(accounts)
    carol, dan = f"{prefix}carol", f"{prefix}dan"
    submit(python, exchange, homes / dan, "carol", "dan's, as carol")
    timestamp = nbgrader_time()
    forged = exchange / COURSE / "inbound" / f"carol+{ASSIGNMENT}+{timestamp}+{'0' * 32}"
    link_inside(dan, forged, timestamp, draft_of(homes / carol))
    for found in (exchange / COURSE / "inbound").iterdir():  # (chmod leaves a link alone)
        subprocess.run(["chmod", "-R", "a+rwX", str(found)], check=True)

    course = tmp_path / "course"

    def left_open() -> list[str]:
        found = [*everything_in(course / "submitted"), *everything_in(course / SET_ASIDE)]
        assert len(found) > 10  # (the students' folders and files)
        return [
            f"{p}: {oct(p.lstat().st_mode)}, uid {p.lstat().st_uid}"
            for p in found
            if p.lstat().st_mode & 0o077 or p.lstat().st_uid != os.geteuid() or p.is_symlink()
        ]

    said = collect(course, exchange, prefix)
    assert handed_in(course / "submitted" / "carol" / ASSIGNMENT) == "carol's own"
    assert len(lines_with("dan's account handed in", said)) == 2, said
    assert left_open() == []
    # an older collect left them open: the next one closes them, though it copies nothing
    subprocess.run(["chmod", "-R", "a+rwX", str(course / "submitted")], check=True)
    said = collect(course, exchange, prefix)
    assert "Submission already exists" in said, said
    assert left_open() == []


@pytest.mark.slow
def test_a_forgery_through_the_hub_leaves_the_student_it_names_their_grade(
    tmp_path_factory, tmp_path, monkeypatch
):
    """carol hands in the reference solutions in her lab's Assignments tab, dan his stubs in
    his; then, in dan's lab, `nbgrader submit multigpu --CourseDirectory.student_id=carol` is
    refused, and the same with nbgrader's plain submit gets through. After collect and
    grading, carol keeps full marks and the forgery is named under dan. So too when dan puts in
    the exchange a link, named as carol's newest submission, to a folder of hers holding the
    notebooks as they were released: collect refuses it."""
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
            released = shared / "exchange" / COURSE / "outbound" / ASSIGNMENT
            draft = users["carol"].run(CAROL_KEEPS_A_DRAFT.format(released=str(released)))
            inbound = shared / "exchange" / COURSE / "inbound"
            link = inbound / f"carol+{ASSIGNMENT}+{nbgrader_time()}+{secrets.token_hex(16)}"
            users["dan"].run(f"import os; os.symlink({draft.strip()!r}, {str(link)!r})")
            assert link.is_symlink()
            monkeypatch.setenv("HUB_USER_PREFIX", hub.env["HUB_USER_PREFIX"])
            collected = nbgrader(course, "collect", ASSIGNMENT, exchange, "--update")
            told = collected.stdout + collected.stderr
            assert len(lines_with(FORGED, told)) == 1, told
            linked = f"refused: {link.name} is a symbolic link (to {draft.strip()})"
            assert len(lines_with(linked, told)) == 1, told
            assert NBGRADER_WARNING not in told and "could not be checked" not in told, told
            assert {p.name for p in (course / "submitted").iterdir()} == {"carol", "dan"}
            assert [p.name[: len("carol+")] for p in (course / SET_ASIDE / "dan" / ASSIGNMENT)
                    .iterdir()] == ["carol+", "carol+"]  # fmt: skip
            graded = subprocess.run(
                [sys.executable, "-m", "grader", "grade", "submitted", "--gradebook",
                 "gradebook.db"], cwd=course, capture_output=True, text=True, timeout=900,
                env=ENV,
            )  # fmt: skip
            assert graded.returncode == 0, graded.stdout + graded.stderr
            full = f"{assignment_points():g}"
            said = graded.stdout
            assert f"carol: {full}/{full}" in said and f"dan: 0/{full}" in said, said
            assert len(lines_with(FORGED, graded.stderr)) == 2, graded.stderr  # (and the link)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
