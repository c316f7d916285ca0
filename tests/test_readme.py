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

from grader.manifest import REPO

BLOCK = re.compile(r"<!-- walkthrough: (\w+) -->\s*```console\n(.*?)```", re.S)
PAGES = [REPO / "README.md", REPO / "README.zh-CN.md", *sorted((REPO / "docs").glob("*.md"))]
WALKTHROUGHS = {
    "student": "README.md",
    "instructor": "README.md",
    "nbgrader": "docs/grading.md",
    "student_zh_CN": "README.zh-CN.md",  # in the Chinese lab: its work/ holds exercises/zh_CN/
}
ACTIVATE = re.compile(r"\. (\.\./)*\.venv/bin/activate")


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


def test_the_readme_picture_exists():
    images = re.findall(r"!\[[^]]+\]\(([^)\s]+)\)", (REPO / "README.md").read_text())
    assert images, "the README shows no picture"
    for image in images:
        assert (REPO / image).is_file(), image
        assert (REPO / image).stat().st_size < 150_000, f"{image} is over 150 KB"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WALKTHROUGHS))
def test_walkthrough_runs_as_written(name, checkout):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
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
        assert proc.returncode in (0, 1), f"{command}\n{proc.stdout}\n{proc.stderr}"
        printed = [line.strip() for line in proc.stdout.splitlines()]
        for line in expected:
            assert any(line in p for p in printed), (
                f"{command} did not print {line!r}:\n{proc.stdout}"
            )
