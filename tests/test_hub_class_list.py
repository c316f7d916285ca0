"""The class list changes while the hub runs: a student added gets an account and a lab, one
removed can no longer log in, and the labs already running go on."""

import csv
import os
import time

import pytest

from hub.lab_hub import remove_account
from tests.test_hub import started_hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from started_hub(tmp_path_factory)


def passwords(hub) -> dict[str, str]:
    with open(hub.state / "passwords.csv") as f:
        return {row["name"]: row["password"] for row in csv.DictReader(f)}


def test_a_student_added_to_a_running_hub_logs_in_beside_a_running_lab(hub):
    ann = hub.login("ann")
    ann.start_lab()
    class_list = hub.folder / "class.txt"
    class_list.write_text(class_list.read_text() + "cy\n")
    prefix = hub.env["HUB_USER_PREFIX"]
    try:
        deadline = time.monotonic() + 30
        while "cy" not in passwords(hub) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "cy" in passwords(hub), "no account for cy 30 s after the class list named them"
        cy = hub.login("cy")
        cy.start_lab()
        assert cy.lab_api("GET", "/contents").status_code == 200
        assert ann.lab_api("GET", "/contents").status_code == 200  # ann's lab went on
        assert "hub: cy was added to the class list" in hub.log_text()
    finally:
        if os.geteuid() == 0:
            remove_account(prefix + "cy")


def test_a_student_removed_from_the_class_list_can_no_longer_log_in(hub):
    assert hub.login("bo")
    class_list = hub.folder / "class.txt"
    kept = [line for line in class_list.read_text().splitlines() if line != "bo"]
    class_list.write_text("\n".join(kept) + "\n")
    with pytest.raises(PermissionError):  # reread at the login itself
        hub.login("bo")
    assert "hub: bo left the class list and can no longer log in" in hub.log_text()
    class_list.write_text("\n".join(kept) + "\nbo\n")
    assert hub.login("bo"), "bo was put back on the class list"


def test_the_instructor_leaving_the_class_list_still_logs_in_and_is_told_so(hub):
    class_list = hub.folder / "class.txt"
    before = class_list.read_text()
    class_list.write_text(before + "instructor\n")
    assert hub.login("instructor")  # the list is reread at each login
    class_list.write_text(before)
    assert hub.login("instructor"), "the hub's admin may log in whatever the class list says"
    log = hub.log_text()
    assert "hub: instructor left the class list and, as the hub's admin, may still log in" in log
    assert "hub: instructor left the class list and can no longer log in" not in log
