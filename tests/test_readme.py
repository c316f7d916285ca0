"""The walk-throughs work as written: every command runs and prints what is shown.

A walk-through is a ```console block under `<!-- walkthrough: NAME -->`, in the README or a
page of docs/: `$ ` starts a command, the lines under it are what it must print (each one
somewhere in a printed line; `...` stands for lines left out). Each walk-through runs in a
fresh copy of the lab, from its root; `cd DIR` moves the rest of the walk-through into DIR,
as in a shell. Activating the virtual environment is skipped: the tests already run in it.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.manifest import REPO, load_manifest

BLOCK = re.compile(r"<!-- walkthrough: (\w+) -->\s*```console\n(.*?)```", re.S)
PAGES = [REPO / "README.md", REPO / "README.zh-CN.md", *sorted((REPO / "docs").glob("*.md"))]
WALKTHROUGHS = {
    "student": "README.md",
    "instructor": "README.md",
    "nbgrader": "docs/grading.md",
    "student_zh_CN": "README.zh-CN.md",  # in the Chinese lab: its work/ holds exercises/zh_CN/
}
ACTIVATE = re.compile(r"\. (\.\./)*\.venv/bin/activate")
CHECK_ALLREDUCE = "python -m grader check {}multigpu/from_scratch.ipynb --exercise allreduce"
STUB = "a check fails: the student has not written `allreduce` yet"
# The steps that exit with another code than 0, and why: (walk-through, command): (code, why).
# Every other step must exit with 0.
EXITS = {
    ("student", CHECK_ALLREDUCE.format("")): (1, STUB),
    ("student", CHECK_ALLREDUCE.format("work/")): (1, STUB),
    ("student", "pytest grader -m allreduce --public-only"): (1, f"pytest: {STUB}"),
    ("student_zh_CN", CHECK_ALLREDUCE.format("")): (1, STUB),
}
STUDENTS, ASSIGNMENT = ("alice", "bob"), "multigpu"
NOTEBOOKS = tuple(name.removesuffix(".ipynb") for name in load_manifest().notebooks)


def each_notebook(*steps: str) -> list[tuple[str, ...]]:
    """`steps` (patterns, {student} and {notebook} in them) for each student's notebook."""
    return [
        tuple(step.format(student=student, notebook=notebook, a=ASSIGNMENT) for step in steps)
        for student in STUDENTS
        for notebook in NOTEBOOKS
    ]


# What nbgrader logs on standard error when a step did its work: (walk-through, command): runs
# of patterns, each run's patterns matched by lines in that order. A step that fails logs an
# error (which fails the walk-through, whatever the step exits with) and writes no notebook
# or page after the one it failed on: autograde writes each notebook into autograded/ once
# before it runs it and once after, so only a line written after "Autograding" counts.
LOGGED = {
    ("nbgrader", "nbgrader generate_assignment multigpu --force"): [
        (rf"Updating/creating assignment '{ASSIGNMENT}'",),
        *[(rf"Writing \d+ bytes to \S*/exercises/{ASSIGNMENT}/{nb}\.ipynb$",) for nb in NOTEBOOKS],
    ],
    ("nbgrader", "DPLAB_DATA_LIMIT=64,32 nbgrader autograde multigpu"): each_notebook(
        r"Autograding \S*/autograded/{student}/{a}/{notebook}\.ipynb$",
        r"Writing \d+ bytes to \S*/autograded/{student}/{a}/{notebook}\.ipynb$",
    ),
    ("nbgrader", "nbgrader generate_feedback multigpu"): each_notebook(
        r"Converting notebook \S*/autograded/{student}/{a}/{notebook}\.ipynb$",
        r"Writing \d+ bytes to \S*/feedback/{student}/{a}/{notebook}\.html$",
    ),
    ("nbgrader", "nbgrader export"): [(r"Exporting grades to grades\.csv$",)],
}
NBGRADER_ERROR = re.compile(r"^\[\w+ \| (ERROR|CRITICAL)\]")
RUNS_NBGRADER = re.compile(r"(^|\s)nbgrader\s")


def walkthroughs() -> dict[str, tuple[str, list[tuple[str, list[str]]]]]:
    """Return each walk-through's page and its (command, lines it must print) pairs."""
    found = {}
    for page in PAGES:
        for name, body in BLOCK.findall(page.read_text()):
            steps: list[tuple[str, list[str]]] = []
            for line in body.splitlines():
                line = line.strip()
                if line.startswith("$ "):
                    steps.append((line[2:], []))
                elif line and line != "...":
                    steps[-1][1].append(line)
            assert name not in found, f"two walk-throughs named {name}"
            found[name] = (str(page.relative_to(REPO)), steps)
    return found


def missing_in_order(runs: list[tuple[str, ...]], lines: list[str]) -> list[str]:
    """The patterns of `runs` that no line matches after the line that matched the pattern
    before it in its run."""
    missing = []
    for run in runs:
        at = 0
        for pattern in run:
            found = next((i for i in range(at, len(lines)) if re.search(pattern, lines[i])), None)
            if found is None:
                missing.append(pattern)
                break
            at = found + 1
    return missing


def copy_of_the_lab(root: Path) -> Path:
    """Copy the lab's files into `root`, as a fresh clone holds them (with what is not yet
    committed), and `work/` as `make lab` leaves it on first start."""
    if (REPO / ".git").is_dir():
        listed = ["git", "ls-files", "-co", "--exclude-standard"]
        files = subprocess.run(listed, cwd=REPO, capture_output=True, text=True, check=True)
        files = files.stdout.split()
    else:  # inside the container image, which has no .git
        skip = {".venv", "work", "class", "results", "__pycache__", ".pytest_cache"}
        files = [
            str(p.relative_to(REPO))
            for p in REPO.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(REPO).parts)
        ]
    for name in files:
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    shutil.copytree(REPO / "exercises", root / "work")
    return root


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A fresh copy of the lab for one walk-through: none sees what another left."""
    return copy_of_the_lab(tmp_path / "lab")


def test_each_walkthrough_is_where_it_belongs():
    assert {name: page for name, (page, _) in walkthroughs().items()} == WALKTHROUGHS


def test_each_stated_exit_code_and_log_names_a_step_of_its_walkthrough():
    """A step renamed in its page must not leave its stated exit code or log behind (it
    would then be held to exit with 0, or to nothing it logs), and every nbgrader step
    states what it logs: nbgrader prints nothing on standard output to hold it to."""
    steps = {(name, command) for name, (_, found) in walkthroughs().items() for command, _ in found}
    assert set(EXITS) - steps == set()
    assert set(LOGGED) - steps == set()
    assert {step for step in steps if RUNS_NBGRADER.search(step[1])} == set(LOGGED)
    assert all(code != 0 and why for code, why in EXITS.values())


def test_the_readme_picture_exists():
    images = re.findall(r"!\[[^]]+\]\(([^)\s]+)\)", (REPO / "README.md").read_text())
    assert images, "the README shows no picture"
    for image in images:
        assert (REPO / image).is_file(), image
        assert (REPO / image).stat().st_size < 150_000, f"{image} is over 150 KB"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WALKTHROUGHS))
def test_walkthrough_runs_as_written(name, checkout):
    # The copy's own packages, as its own virtual environment would give them (this Python's
    # finds this checkout's): `pytest grader` loads grader.front.pytest_options before the
    # copy's conftest.py.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env["PYTHONPATH"] = str(checkout.resolve())
    if name == "nbgrader" and shutil.which("nbgrader", path=env["PATH"]) is None:
        pytest.skip("nbgrader is the instructor's: not installed here")
    cwd = checkout = checkout.resolve()
    if name.endswith("_zh_CN"):  # `make lab LANG=zh_CN` fills work/ with the Chinese notebooks
        shutil.rmtree(checkout / "work")
        shutil.copytree(REPO / "exercises" / "zh_CN", checkout / "work")
    for command, expected in walkthroughs()[name][1]:
        if ACTIVATE.fullmatch(command):  # and names the lab's own environment from here
            assert (cwd / command.split()[1]).resolve().parents[2] == checkout, command
            continue  # the tests already run inside the virtual environment
        if command.startswith("cd "):
            cwd = (cwd / command[3:]).resolve()
            assert cwd.is_dir(), command
            continue
        proc = subprocess.run(
            command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=900
        )
        said = f"{command}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        code, why = EXITS.get((name, command), (0, "it did its work"))
        assert proc.returncode == code, f"exit code {proc.returncode}, not {code} ({why}): {said}"
        assert "Traceback (most recent call last)" not in proc.stderr, said
        printed = [line.strip() for line in proc.stdout.splitlines()]
        for line in expected:
            assert any(line in p for p in printed), (
                f"{command} did not print {line!r}:\n{proc.stdout}"
            )
        if (name, command) in LOGGED:  # nbgrader: it logs on standard error
            logged = [line.strip() for line in proc.stderr.splitlines()]
            assert not [line for line in logged if NBGRADER_ERROR.match(line)], said
            missing = missing_in_order(LOGGED[name, command], logged)
            assert not missing, f"{command} logged nothing matching {missing}:\n{proc.stderr}"
