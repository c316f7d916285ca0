"""`make hub-clear`: after the course, the accounts the hub made go, and nothing else; so do
their files anywhere on the machine, but for the exchange's submissions, which stay."""

import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from grader.manifest import REPO
from hub.clear import places
from tests.conftest import python

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes and removes system accounts")


def exists(account: str) -> bool:
    try:
        pwd.getpwnam(account)
    except KeyError:
        return False
    return True


def clear(state, prefix, *extra):
    return subprocess.run(
        [python(), "-m", "hub.clear", "--state", str(state), "--prefix", prefix, *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@as_root
def test_the_accounts_the_hub_made_go_and_no_other(tmp_path):
    prefix = f"t{secrets.token_hex(2)}-"
    state = tmp_path / "state"
    state.mkdir()
    (state / "passwords.csv").write_text("name,password\ninstructor,x\nzed,y\n")
    homes = tmp_path / "homes"
    homes.mkdir()
    made = [prefix + "zed", prefix + "other"]  # "other" is not in passwords.csv
    for account in made:
        subprocess.run(
            ["useradd", "--create-home", "--home-dir", str(homes / account), account], check=True
        )
    try:
        listed = clear(state, prefix)
        assert listed.returncode == 0, listed.stderr
        assert f"would remove {prefix}zed and {homes / (prefix + 'zed')}" in listed.stdout
        assert "other" not in listed.stdout
        assert "nothing changed; run it again with --yes" in listed.stdout
        assert exists(prefix + "zed")
        done = clear(state, prefix, "--yes")
        assert done.returncode == 0, done.stderr
        assert not exists(prefix + "zed") and not (homes / (prefix + "zed")).exists()
        assert exists(prefix + "other") and (homes / (prefix + "other")).is_dir()
        assert (state / "passwords.csv").exists()  # the state stays unless asked
        assert clear(state, prefix, "--with-state", "--yes").returncode == 0
        assert not state.exists()
    finally:
        for account in made:
            subprocess.run(["userdel", "--remove", account], capture_output=True)


@as_root
def test_an_empty_prefix_is_refused(tmp_path):
    done = clear(tmp_path, "", "--yes")
    assert done.returncode == 2
    assert "an empty --prefix would name the system's own accounts" in done.stderr


def theirs(uid: int) -> list[str]:
    """Every file of the user id `uid` on this machine's local file systems."""
    found = subprocess.run(["find", *places(), "-xdev", "-uid", str(uid)], capture_output=True,
                           text=True)  # fmt: skip
    return found.stdout.split()


@as_root
def test_a_removed_account_leaves_no_file_but_its_submissions_which_become_roots():
    """Files a student's programs left in /tmp, /var/tmp and /dev/shm (torch's, the grader's,
    a Terminal's) go with the account; its submission in the exchange stays, as root's; the
    students' Python is left alone. The output says what it keeps and how to remove it."""
    prefix = f"t{secrets.token_hex(2)}-"
    account = prefix + "zed"
    base = Path(tempfile.mkdtemp(prefix="lab-clear-"))  # (a folder the account may enter)
    base.chmod(0o755)
    state, exchange, lent = base / "state", base / "exchange", base / "python"
    for folder in (state, exchange, lent):
        folder.mkdir()
    (state / "passwords.csv").write_text("name,password\nzed,y\n")
    (state / "made.json").write_text(json.dumps(
        {"prefix": prefix, "exchange": str(exchange), "python_folder": str(lent)}
    ))  # fmt: skip
    exchange.chmod(0o1777)
    subprocess.run(["useradd", "--create-home", "--home-dir", str(base / account),
                    "--user-group", account], check=True)  # fmt: skip
    entry = pwd.getpwnam(account)
    left = [Path(f"/tmp/torchinductor_{account}"), Path(f"/var/tmp/{account}-cache"),
            Path(f"/dev/shm/torch_{account}")]  # fmt: skip
    submission = exchange / f"{account}+multigpu+2024" / "from_scratch.ipynb"
    as_them = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    try:
        for path in left:
            subprocess.run(["sh", "-c", f"mkdir {path} && touch {path}/cache"], check=True,
                           **as_them)  # fmt: skip
        subprocess.run(["sh", "-c", f"mkdir {submission.parent} && echo '{{}}' > {submission}"],
                       check=True, **as_them)  # fmt: skip
        (lent / "python").write_text("#!/bin/sh\n")
        assert len(theirs(entry.pw_uid)) >= 2 * len(left) + 2

        listed = clear(state, prefix, "--yes-is", "YES=1")
        assert listed.returncode == 0, listed.stderr
        # (and any an account removed before left, whose user id this one was given)
        counted = re.search(r"would remove their (\d+) files outside their homes", listed.stdout)
        assert counted and int(counted.group(1)) >= 2 * len(left), listed.stdout
        assert "would give their 2 files in the exchange to its owner" in listed.stdout
        assert "nothing changed; run it again with YES=1" in listed.stdout
        assert all(path.exists() for path in left)

        done = clear(state, prefix, "--yes")
        assert done.returncode == 0, done.stderr
        assert not exists(account)
        assert theirs(entry.pw_uid) == []
        assert not any(path.exists() for path in left)
        assert submission.read_text() == "{}\n"
        assert (submission.stat().st_uid, submission.parent.stat().st_uid) == (0, 0)
        assert (lent / "python").exists()
        said = done.stdout
        assert f"keeps nbgrader's exchange {exchange}" in said and f"rm -r {exchange}" in said
        assert f"keeps the students' Python in {lent}" in said and f"rm -r {lent}" in said
    finally:
        subprocess.run(["userdel", "--remove", account], capture_output=True)
        for path in left:
            subprocess.run(["rm", "-rf", str(path)])
        shutil.rmtree(base)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_hub_clear_says_to_run_it_again_with_yes_1(tmp_path):
    """The Makefile's own command line: its "nothing changed" line names YES=1, not --yes."""
    planned = subprocess.run(["make", "-n", "hub-clear"], cwd=REPO, capture_output=True,
                             text=True)  # fmt: skip
    command = next(line for line in planned.stdout.splitlines() if "-m hub.clear" in line)
    words = shlex.split(command)
    assert words[1:3] == ["-m", "hub.clear"] and "--yes" not in words
    (tmp_path / "passwords.csv").write_text("name,password\n")
    said = subprocess.run([python(), *words[1:], "--state", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    assert said.returncode == 0, said.stderr
    assert "nothing changed; run it again with YES=1 to do it" in said.stdout
