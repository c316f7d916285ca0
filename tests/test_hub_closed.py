"""The instructor's folders are closed to the students' accounts, or the hub does not start.

hub/closed.py judges a folder by the rights that the folders on its way give other accounts;
hub/jupyterhub_config.py refuses to start, saying why, while the lab's checkout, the course
folder or the state folder is open. What a student's Terminal then meets is tried in
tests/test_hub_walkthrough.py, on the graded class of the walk-through."""

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from hub import running
from hub.closed import check_closed, closed_on_the_way, instructors_folders, opening
from tests.test_hub import closed_lab

REPO = Path(__file__).resolve().parents[1]

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="makes accounts, as the hub does")


@pytest.fixture
def open_folder():
    """A folder every account may enter and read, as /tmp's own are not (pytest's are 0700)."""
    folder = running.temporary_homes()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_folder_is_open_until_a_folder_on_its_way_closes_it(open_folder):
    lab = open_folder / "lab"
    (lab / "solutions").mkdir(parents=True)
    lab.chmod(0o755)
    (lab / "solutions").chmod(0o755)
    assert opening(lab) == "other accounts may read it (mode 0755)"
    assert opening(lab / "solutions") == "other accounts may read it (mode 0755)"
    lab.chmod(0o711)
    assert opening(lab) == "other accounts may enter it (mode 0711)"
    assert opening(lab / "solutions"), "a known path under a folder others may enter is open"
    lab.chmod(0o700)
    assert opening(lab) == opening(lab / "solutions") == ""
    assert closed_on_the_way(lab / "solutions") == lab


@root_only
def test_group_rights_count_where_the_group_has_another_member(open_folder):
    lab = open_folder / "lab"
    lab.mkdir(mode=0o750)
    lab.chmod(0o750)
    assert opening(lab) == "", "root's own group has no other member here"
    account = f"g{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--user-group", account], check=True)
    try:
        os.chown(lab, 0, int(subprocess.check_output(["id", "-g", account])))
        assert opening(lab) == "other accounts may read it (mode 0750)"
    finally:
        subprocess.run(["userdel", account], capture_output=True)


def test_the_refusal_names_each_open_folder_and_how_to_close_it(open_folder, tmp_path):
    lab, state = open_folder / "lab", tmp_path / "state"
    lab.mkdir(mode=0o755)
    lab.chmod(0o755)
    state.mkdir(mode=0o700)
    with pytest.raises(SystemExit) as refused:
        check_closed(instructors_folders(lab, lab, state))
    said = str(refused.value)
    assert said == (
        f"hub: the lab's checkout and course folder {lab} is open to the students' accounts: "
        f"other accounts may read it (mode 0755). Close it with `chmod 700 {lab}`; the labs "
        "do not need it."
    )
    lab.chmod(0o700)
    check_closed(instructors_folders(lab, lab, state))  # nothing to say
    with pytest.raises(SystemExit, match="cannot enter: put the exchange outside"):
        check_closed(instructors_folders(lab, lab, state), str(lab / "exchange"))


@pytest.mark.slow
@root_only
def test_the_hub_does_not_start_while_the_course_folder_is_open(open_folder, tmp_path):
    if why := running.hub_lacks():
        pytest.skip(why)
    course = open_folder / "course"
    course.mkdir(mode=0o755)
    course.chmod(0o755)
    hub = running.Hub(tmp_path, ["ann"], lab=closed_lab(tmp_path), HUB_SPAWNER="process",
                      HUB_COURSE=str(course), HUB_HOMES=str(open_folder))  # fmt: skip
    try:
        with pytest.raises(RuntimeError, match="the hub stopped at start") as stopped:
            hub.start()
    finally:
        hub.stop()
    assert f"hub: the course folder {course} is open to the students' accounts" in str(
        stopped.value
    )
    assert f"Close it with `chmod 700 {course}`" in str(stopped.value)
    assert "the lab's checkout" not in str(stopped.value)  # the closed copy it runs from
