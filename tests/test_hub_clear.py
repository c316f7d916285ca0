"""`make hub-clear`: after the course, the accounts the hub made go, and nothing else."""

import os
import pwd
import secrets
import subprocess

import pytest

from tests.conftest import python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes and removes system accounts")


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
        assert "other" not in listed.stdout and "nothing changed" in listed.stdout
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


def test_an_empty_prefix_is_refused(tmp_path):
    done = clear(tmp_path, "", "--yes")
    assert done.returncode == 2
    assert "an empty --prefix would name the system's own accounts" in done.stderr
