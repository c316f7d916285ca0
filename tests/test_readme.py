"""The README's walk-throughs work as written: every command runs and prints what is shown."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.manifest import REPO

BLOCK = re.compile(r"<!-- walkthrough: (\w+) -->\s*```console\n(.*?)```", re.S)


def walkthroughs() -> dict[str, list[tuple[str, list[str]]]]:
    """Return each walk-through as (command, lines it must print) pairs."""
    found = {}
    for name, body in BLOCK.findall((REPO / "README.md").read_text()):
        steps: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif line and line != "...":
                steps[-1][1].append(line)
        found[name] = steps
    return found


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the lab's files, with `work/` as `make lab` leaves it on first start."""
    root = tmp_path_factory.mktemp("checkout")
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


def test_readme_has_both_walkthroughs():
    assert set(walkthroughs()) == {"student", "instructor"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["student", "instructor"])
def test_walkthrough_runs_as_written(name, checkout):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for command, expected in walkthroughs()[name]:
        if command.startswith(". .venv/bin/activate"):
            continue  # the tests already run inside the virtual environment
        proc = subprocess.run(
            command, shell=True, cwd=checkout, env=env, capture_output=True, text=True, timeout=900
        )
        assert proc.returncode in (0, 1), f"{command}\n{proc.stdout}\n{proc.stderr}"
        printed = [line.strip() for line in proc.stdout.splitlines()]
        for line in expected:
            assert any(line in p for p in printed), (
                f"{command} did not print {line!r}:\n{proc.stdout}"
            )
