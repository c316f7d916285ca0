"""docs/hub.md's class in ten minutes runs as written: the hub on a fresh copy of the lab, two
students through the login form, a check in a Terminal, and the exchange from release to grades.

The walk-through is the ```console block under `<!-- hub-walkthrough -->` (not `walkthrough:
NAME`, which tests/test_readme.py runs as plain commands). Its lines:

- `$ COMMAND`: the instructor's, run in the course folder (the copy's root), as written but for
  EXCHANGE, which becomes a temporary folder. `make hub ...` starts the hub, with the settings
  on its line; activating the virtual environment is skipped (the tests run in it already).
- `NAME$ COMMAND`: typed into a new Terminal of NAME's lab.
- `[NAME, NAME] STEP`: what each student named does in their browser; STEP is one of ACTIONS.
- any other line: what the command above it must print, somewhere in a line it printed
  (standard output or error, as a terminal shows both); `...` stands for lines left out.
"""

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from grader.report.json_report import read_json
from hub import running
from hub.lab_hub import read_class_list, remove_account
from tests.test_hub import set_up
from tests.test_readme import copy_of_the_lab

REPO = Path(__file__).resolve().parents[1]

PAGE = REPO / "docs" / "hub.md"
BLOCK = re.compile(r"<!-- hub-walkthrough -->\s*```console\n(.*?)```", re.S)
EXCHANGE = "/srv/nbgrader/exchange"  # the walk-through's; the test's own folder replaces it
ACTIVATE = ". .venv/bin/activate"
MAKE_HUB = "make hub"
# The settings the walk-through's `make hub` may name: HUB_SPAWNER goes to the hub as it is,
# HUB_EXCHANGE with the test's folder for EXCHANGE, and HUB_CLASS_LIST's names are the class.
HUB_SETTINGS = {"HUB_SPAWNER", "HUB_CLASS_LIST", "HUB_EXCHANGE"}
COURSE_ID, ASSIGNMENT = "multigpu-lab", "multigpu"
CHECK = "python -m grader check multigpu/from_scratch.ipynb --exercise allreduce"
# The steps that exit with another code than 0, and why: (who, command): (code, why).
EXITS = {("alice", CHECK): (1, "a check fails: the student has not written `allreduce` yet")}
NBGRADER_ERROR = re.compile(r"^\[\w+ \| (ERROR|CRITICAL)\]")
# What collect says of a submission it cannot take for its student (hub/lab_exchange.py):
# honest submissions, each made by its student's own account (the hub run by root), give none.
COLLECT_WARNINGS = ("handed in", "could not be checked", "cheating attempt")


@dataclass
class Step:
    who: str  # "$" for the instructor, a student's name for their Terminal, "[]" for a browser
    text: str  # the command, or the browser step
    names: list[str] = field(default_factory=list)  # the students of a browser step
    shows: list[str] = field(default_factory=list)  # the lines it must print


def walkthrough() -> list[Step]:
    found = BLOCK.findall(PAGE.read_text())
    assert len(found) == 1, f"{PAGE.name} has {len(found)} hub walk-throughs, not one"
    steps: list[Step] = []
    for line in found[0].splitlines():
        line = line.strip()
        if line.startswith("$ "):
            steps.append(Step("$", line[2:]))
        elif typed := re.fullmatch(r"(\w+)\$ (.+)", line):
            steps.append(Step(typed[1], typed[2]))
        elif browser := re.fullmatch(r"\[([\w, ]+)\] (.+)", line):
            names = [name.strip() for name in browser[1].split(",")]
            steps.append(Step("[]", browser[2], names))
        elif line and line != "...":
            assert steps and steps[-1].who != "[]", f"{line!r} follows no command"
            steps[-1].shows.append(line)
    return steps


# ---- what the students do in their browsers -----------------------------------------------


def names_in(listing) -> set[str]:
    return {item["name"] for item in listing.json()["content"]}


def log_in(run: "Class", name: str) -> None:
    """The hub's login form, with the first password the hub wrote; the lab then starts."""
    user = run.users[name] = run.hub.login(name)
    user.start_lab()
    assert names_in(user.lab_api("GET", "/contents")) == set(), "copied in, not fetched"


def fetch(run: "Class", name: str) -> None:
    user, course = run.users[name], {"course_id": COURSE_ID}
    listed = user.in_lab("GET", "/assignments", params=course).json()
    assert [(a["assignment_id"], a["status"]) for a in listed["value"]] == [
        (ASSIGNMENT, "released")
    ], listed
    fetched = user.in_lab("POST", "/assignments/fetch", data=course | {"assignment_id": ASSIGNMENT})
    assert fetched.status_code == 200, fetched.text
    assert names_in(user.lab_api("GET", f"/contents/{ASSIGNMENT}")) == run.notebooks()


def open_terminal(run: "Class", name: str) -> None:
    """Nothing to do: each `NAME$` command opens a Terminal of its own (User.terminal)."""
    assert name in run.users, f"{name} opens a Terminal before logging in"


def write_every_exercise(run: "Class", name: str) -> None:
    """The reference solutions, saved over the fetched notebooks as the lab saves them."""
    for notebook in sorted(run.notebooks()):
        content = json.loads((run.course / "solutions" / ASSIGNMENT / notebook).read_text())
        saved = run.users[name].lab_api("PUT", f"/contents/{ASSIGNMENT}/{notebook}",
                                        data=json.dumps({"type": "notebook",
                                                         "content": content}))  # fmt: skip
        assert saved.status_code == 200, saved.text


def submit(run: "Class", name: str) -> None:
    form = {"course_id": COURSE_ID, "assignment_id": ASSIGNMENT}
    submitted = run.users[name].in_lab("POST", "/assignments/submit", data=form)
    assert submitted.status_code == 200, submitted.text
    assert '"success": false' not in submitted.text, submitted.text


def fetch_feedback(run: "Class", name: str) -> None:
    """The submission's Fetch Feedback button: a page per notebook arrives in the student's lab,
    under the assignment's feedback/<time of the submission>/, with their score in
    results.json, and nobody else's."""
    user, course = run.users[name], {"course_id": COURSE_ID}
    form = course | {"assignment_id": ASSIGNMENT}
    fetched = user.in_lab("POST", "/assignments/fetch_feedback", data=form)
    assert fetched.status_code == 200, fetched.text
    listed = user.in_lab("GET", "/assignments", params=course).json()["value"]
    (submitted,) = [a for a in listed if a["status"] == "submitted"]
    (submission,) = submitted["submissions"]
    assert submission["has_local_feedback"], submission  # the list offers "view feedback"
    folder = f"{ASSIGNMENT}/feedback/{submission['timestamp']}"
    pages = names_in(user.lab_api("GET", f"/contents/{folder}"))
    assert pages == {Path(nb).stem + ".html" for nb in run.notebooks()}, pages
    (graded,) = [r for r in read_json(run.course / "results.json") if r.id == name]
    page = user.lab_api("GET", f"/contents/{folder}/from_scratch.html", params={"format": "text"})
    text = page.json()["content"]
    assert f"Feedback for {name}: " in text, text[:300]
    assert f"Total: {graded.score:g}/{graded.max_score:g} points" in text, text[:600]
    others = {student for student in run.students if student != name}
    assert not [other for other in others if f"Feedback for {other}" in text]


# A browser step of the walk-through: the pattern its text must match, and what the test does.
ACTIONS = [
    (r"log in at http://127\.0\.0\.1:8000/hub/login with their password from \S+", log_in),
    (rf"Nbgrader > Assignment List: Fetch {ASSIGNMENT}", fetch),
    (r"File > New > Terminal", open_terminal),
    (r"writes every exercise, and saves each notebook", write_every_exercise),
    (rf"Nbgrader > Assignment List: Submit {ASSIGNMENT}", submit),
    (r"Nbgrader > Assignment List: Fetch Feedback", fetch_feedback),
]


def action_of(text: str):
    found = [action for pattern, action in ACTIONS if re.fullmatch(pattern, text)]
    assert len(found) == 1, f"the test does not know what a student does for {text!r}"
    return found[0]


def make_hub_settings(command: str) -> dict[str, str]:
    """The settings that the walk-through's `make hub VAR=VALUE ...` names."""
    words = shlex.split(command, comments=True)
    assert words[:2] == MAKE_HUB.split(), command
    settings = dict(word.split("=", 1) for word in words[2:])
    assert set(settings) <= HUB_SETTINGS, f"the test does not know {set(settings) - HUB_SETTINGS}"
    return settings


# ---- the walk-through's shape, without a hub ----------------------------------------------


def test_the_walkthrough_has_steps_the_test_knows():
    steps = walkthrough()
    instructor = [step.text for step in steps if step.who == "$"]
    assert sum(command.startswith(MAKE_HUB) for command in instructor) == 1
    for step in steps:
        if step.who == "[]":
            action_of(step.text)
        elif step.who == "$" and step.text.startswith(MAKE_HUB):
            assert make_hub_settings(step.text)["HUB_EXCHANGE"] == EXCHANGE
    stated = {(step.who, step.text) for step in steps if step.who not in ("$", "[]")}
    assert set(EXITS) <= stated, "a stated exit code names no student's command"
    assert all(code != 0 and why for code, why in EXITS.values())


def test_make_hub_runs_what_the_test_starts():
    """The test starts `jupyterhub -f hub/jupyterhub_config.py` (running.Hub) for `make hub`."""
    recipe = re.search(r"^hub:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M)
    assert recipe and recipe[1] == "$(BIN)/jupyterhub -f hub/jupyterhub_config.py", recipe
    assert running.Hub.config == REPO / "hub" / "jupyterhub_config.py"


# ---- the walk-through, run --------------------------------------------------------------


@dataclass
class Class:
    course: Path  # the fresh copy of the lab, where the instructor works
    exchange: Path
    homes: Path
    prefix: str  # the students' accounts' names start with it
    hub: running.Hub | None = None
    users: dict = field(default_factory=dict)
    students: list[str] = field(default_factory=list)

    def notebooks(self) -> set[str]:
        return {p.name for p in (self.course / "solutions" / ASSIGNMENT).glob("*.ipynb")}

    def env(self) -> dict[str, str]:
        # collect maps each submission's owner, `<prefix><name>`, back to a student; the
        # commands import the clone's packages, as its own environment would give them
        return dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                    HUB_USER_PREFIX=self.prefix, PYTHONPATH=str(self.course))  # fmt: skip

    def start_hub(self, command: str) -> None:
        """What `make hub` runs, with the settings of `command`, on free ports, the accounts
        under a prefix and homes of their own, and (as root) a Python they may run."""
        settings = make_hub_settings(command)
        self.students = read_class_list(self.course / settings.pop("HUB_CLASS_LIST"))
        settings["HUB_EXCHANGE"] = settings["HUB_EXCHANGE"].replace(EXCHANGE, str(self.exchange))
        settings |= {"HUB_HOMES": str(self.homes), "HUB_USER_PREFIX": self.prefix,
                     "HUB_COURSE": str(self.course)}  # fmt: skip
        if os.geteuid() == 0:
            from tests.test_hub import lent_python

            settings["HUB_PYTHON"] = lent_python(self.homes)
        # the state folder where `make hub` keeps it, hub/state in the course folder
        self.hub = running.Hub(self.course / "hub", self.students, lab=self.course, **settings)
        self.hub.start()

    def stop(self) -> list[str]:
        """Stop the hub and remove what it made; the accounts that could not be removed."""
        if self.hub:
            self.hub.stop()
        left = []
        if os.geteuid() == 0:
            left = [
                a for a in (self.prefix + name for name in self.students) if not remove_account(a)
            ]
        shutil.rmtree(self.homes, ignore_errors=True)
        shutil.rmtree(self.exchange.parent, ignore_errors=True)
        shutil.rmtree(self.course.parent, ignore_errors=True)
        return left


def shown_in(shown: str, lines: list[str], said: str) -> None:
    printed = [line.strip() for line in shown.splitlines()]
    for line in lines:
        assert any(line in p for p in printed), f"{said}\ndid not show {line!r}"


def run_instructors(run: Class, command: str, shows: list[str]) -> None:
    if command == ACTIVATE:
        return  # the tests already run in the lab's environment
    if command.startswith(MAKE_HUB):
        run.start_hub(command)
        return
    typed = command.replace(EXCHANGE, str(run.exchange))
    proc = subprocess.run(typed, shell=True, cwd=run.course, env=run.env(), capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    said = f"$ {typed}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, f"exit code {proc.returncode}, not 0: {said}"
    assert "Traceback (most recent call last)" not in proc.stderr, said
    logged = proc.stderr.splitlines()
    assert not [line for line in logged if NBGRADER_ERROR.match(line.strip())], said
    if " collect " in f" {command} " and os.geteuid() == 0:  # (else every lab is this user's)
        assert not [line for line in logged if any(w in line for w in COLLECT_WARNINGS)], said
    shown_in(proc.stdout + "\n" + proc.stderr, shows, said)


def run_in_terminal(run: Class, name: str, command: str, shows: list[str]) -> None:
    shown, status = run.users[name].terminal(command)
    said = f"{name}$ {command}\n{shown}"
    code, why = EXITS.get((name, command), (0, "it did its work"))
    assert status == code, f"exit code {status}, not {code} ({why}): {said}"
    assert "Traceback (most recent call last)" not in shown, said
    shown_in(shown, shows, said)


@pytest.mark.slow
def test_the_class_in_ten_minutes_runs_as_written(tmp_path):
    if why := running.hub_lacks():
        pytest.skip(why)
    # the clone in a folder every account may enter, so that only the walk-through closes it
    course = set_up(copy_of_the_lab(running.temporary_homes() / "lab")).resolve()
    course.chmod(0o755)
    exchange = running.temporary_homes() / "exchange"  # a folder every account may reach
    run = Class(course, exchange, running.temporary_homes(), f"t{secrets.token_hex(2)}-")
    try:
        for step in walkthrough():
            if step.who == "$":
                run_instructors(run, step.text, step.shows)
            elif step.who == "[]":
                assert run.hub, f"{step.text!r} before the hub started"
                for name in step.names:
                    assert name in run.students, f"{name} is not in the class list"
                    action_of(step.text)(run, name)
            else:
                run_in_terminal(run, step.who, step.text, step.shows)
        assert run.hub and set(run.users) == set(run.students) == {"alice", "bob"}
        submitted = {p.parent.parent.name for p in course.glob(f"submitted/*/{ASSIGNMENT}/*")}
        assert submitted == {"alice", "bob"}
        for name, other in (("alice", "bob"), ("bob", "alice")):
            nothing_of_the_instructors_is_open_to(run, name, other)
    finally:
        left = run.stop()
    assert not left, f"the students' accounts {left} are still there"


# ---- what a student's Terminal cannot reach ----------------------------------------------


def instructors_things(run: Class, other: str) -> dict[str, str]:
    """What one student tries on the instructor's files, from their Terminal: a shell command
    for each, which succeeds where the try does."""
    course, hub = run.course, run.hub
    assert hub is not None
    theirs = course / "submitted" / other / ASSIGNMENT / "from_scratch.ipynb"
    private = Path("grader", "exercises", "allreduce", "private", "hidden.py")
    reads = {
        "the solutions": course / "solutions" / ASSIGNMENT / "from_scratch.ipynb",
        "the hidden checks": course / private,
        "another student's submission": theirs,
        "the grades": course / "results.json",
        "the gradebook": course / "gradebook.db",
        "the first passwords": hub.state / "passwords.csv",
        "the seed": course / "seed.txt",
    }
    for what, path in reads.items():
        assert path.is_file(), f"{what}: {path} is not there to try"
    return {what: f"cat {shlex.quote(str(path))}" for what, path in reads.items()} | {
        "a new file in submitted/": f"touch {shlex.quote(str(course / 'submitted' / 'x'))}",
        "renaming another's notebook": (
            f"mv {shlex.quote(str(theirs))} {shlex.quote(str(theirs.with_name('gone.ipynb')))}"
        ),
        "listing the state folder": f"ls {shlex.quote(str(hub.state))}",
    }


def nothing_of_the_instructors_is_open_to(run: Class, name: str, other: str) -> None:
    """Every try from `name`'s Terminal fails, while reading their own notebook works."""
    tries = instructors_things(run, other) | {
        "their own notebook": f"cat {ASSIGNMENT}/from_scratch.ipynb"
    }
    script = (
        't() { if eval "$2" >/dev/null 2>&1; then echo "OPEN: $1"; else echo "closed: $1"; fi; }'
    )
    script += "".join(f"; t {shlex.quote(what)} {shlex.quote(cmd)}" for what, cmd in tries.items())
    shown, _ = run.users[name].terminal(script)
    outcome = {what: state for state, what in re.findall(r"^(OPEN|closed): (.+?)\s*$", shown, re.M)}
    expected = {what: "closed" for what in tries} | {"their own notebook": "OPEN"}
    assert outcome == expected, f"{name}'s Terminal showed:\n{shown}"
