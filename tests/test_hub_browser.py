"""A student under a hub with nbgrader's exchange (HUB_EXCHANGE), in a real browser: headless
Chromium driven over the DevTools protocol (tests/browser.py). tests/test_hub.py calls the
exchange's handlers directly; this test goes the way a student does, through the login form
and JupyterLab's menus, so that a lab whose Assignments list cannot be reached fails here.

Without Chromium the test skips (Debian: apt install chromium); CI installs it (.ci/run)."""

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.manifest import load_manifest
from tests.browser import NO_CHROMIUM, Browser, chromium
from tests.test_hub import REPO, names_in, running, started_hub

pytestmark = pytest.mark.slow
COURSE = "multigpu-lab"  # docker/lab-config-exchange/nbgrader_config.py's, without LAB_COURSE
NOTEBOOKS = sorted(load_manifest().notebooks)
ITEMS = ".lm-Menu.lm-MenuBar-menu .lm-Menu-item"  # the items of the open main menu


def generated_course(folder: Path) -> Path:
    """The instructor's course folder, the assignment generated, ready for release."""
    from tests.nbgrader_course import nbgrader

    course = folder / "course"
    course.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", course)
    shutil.copytree(REPO / "solutions" / "multigpu", course / "solutions" / "multigpu")
    nbgrader(course, "generate_assignment", "multigpu", "--force")
    return course


def log_in(browser: Browser, hub, name: str) -> None:
    """Sign in through the hub's login form, and wait for the lab that the hub starts."""
    browser.goto(hub.base + "/hub/login")
    browser.type_into("#username_input", name)
    browser.type_into("#password_input", hub.password(name))  # from the hub's passwords.csv
    browser.click("#login_submit")
    browser.wait_until(f"location.pathname.startsWith('/user/{name}/lab')",
                       f"{name}'s lab after signing in", timeout=240)  # fmt: skip


def open_menu(browser: Browser, title: str, timeout: float = 120) -> list[str]:
    """Open the main menu `title` with a click and return its items. JupyterLab draws the
    menu bar before all of its plugins have started, and a click that early opens nothing,
    so the click is tried again until the menu shows."""
    browser.wait_for(".lm-MenuBar-item", title, timeout)
    for _ in range(int(timeout / 3)):
        browser.click(".lm-MenuBar-item", title)
        try:
            browser.wait_for(".lm-Menu.lm-MenuBar-menu", timeout=3)
            return browser.texts(ITEMS)
        except AssertionError:
            continue
    raise AssertionError(f"the menu {title} did not open in {timeout} s")


def palette_finds(browser: Browser, words: str) -> list[str]:
    """What JupyterLab's command palette (Ctrl+Shift+C) lists for `words`."""
    items = ".lm-CommandPalette-item"
    browser.press("C", "KeyC", 67, modifiers=2 | 8)
    browser.wait_for(".lm-CommandPalette input")
    everything = browser.texts(items)
    browser.type_into(".lm-CommandPalette input", words)
    deadline = time.monotonic() + 10
    while (found := browser.texts(items)) == everything:  # the palette filters on a timer
        assert time.monotonic() < deadline, f"the palette did not answer {words!r}"
        time.sleep(0.2)
    browser.press("Escape", "Escape", 27)
    return found


def test_a_student_fetches_submits_and_gets_feedback_from_the_assignments_list(
    tmp_path_factory, tmp_path, monkeypatch
):
    """ann signs in, opens Nbgrader > Assignment List (the menu and the palette offer nothing
    else of nbgrader's), fetches the released assignment, and submits it; the instructor
    collects, grades (one exercise, to be quick) and releases the feedback, and her Fetch
    Feedback button brings her pages into her lab. bo, who cannot fetch hers, tries to reach
    them from his Terminal."""
    if not chromium():
        pytest.skip(NO_CHROMIUM)
    course = generated_course(tmp_path)
    shared = running.temporary_homes()
    exchange = shared / "exchange"
    try:
        for hub in started_hub(tmp_path_factory, HUB_EXCHANGE=str(exchange)):
            from tests.nbgrader_course import nbgrader

            # collect and release_feedback find each student's account by the hub's prefix
            monkeypatch.setenv("HUB_USER_PREFIX", hub.env["HUB_USER_PREFIX"])
            nbgrader(course, "release_assignment", "multigpu", f"--Exchange.root={exchange}")
            with Browser(tmp_path / "browser") as browser:
                try:
                    a_student_fetches_and_submits(browser, hub, tmp_path)
                    the_instructor_grades_and_releases_feedback(course, exchange)
                    the_student_fetches_feedback(browser, tmp_path)
                except Exception:
                    with contextlib.suppress(Exception):  # the failure's own message first
                        shot = browser.screenshot(tmp_path / "at-failure.png")
                        print(f"the browser at the failure: {shot}")
                    raise
            inbound = list((exchange / COURSE / "inbound").glob("ann+multigpu+*"))
            assert len(inbound) == 1, inbound
            assert sorted(p.name for p in inbound[0].glob("*.ipynb")) == NOTEBOOKS
            ann = hub.login("ann")
            ann.start_lab()  # running already: this signs her requests into it
            fetched = names_in(ann.lab_api("GET", "/contents/multigpu"))
            assert fetched == set(NOTEBOOKS) | {"feedback"}  # into her work folder
            pages = her_feedback_pages(ann)
            assert set(pages) == {Path(nb).stem + ".html" for nb in NOTEBOOKS}
            assert "Feedback for ann: <code>from_scratch.ipynb</code>" in pages["from_scratch.html"]
            assert "Total: 3/3 points" in pages["from_scratch.html"]  # try_gpu, written
            if os.geteuid() == 0:  # (else every lab runs as this test's user, who reads all)
                another_student_cannot_reach_it(hub, exchange, inbound[0])
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def the_instructor_grades_and_releases_feedback(course: Path, exchange: Path) -> None:
    """Collect, grade the one exercise try_gpu into feedback pages, and release them."""
    from tests.nbgrader_course import nbgrader

    nbgrader(course, "collect", "multigpu", f"--Exchange.root={exchange}")
    graded = subprocess.run(
        [sys.executable, "-m", "grader", "grade", "submitted", "-e", "try_gpu",
         "--nbgrader-feedback", "feedback"],
        cwd=course, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert "ann: 3/3" in graded.stdout, graded.stdout
    released = nbgrader(course, "release_feedback", "multigpu", f"--Exchange.root={exchange}")
    assert "Releasing feedback for student 'ann'" in released.stderr, released.stderr
    if os.geteuid() == 0:  # each page given to its student's account alone
        assert "readable by every account" not in released.stderr, released.stderr


def her_feedback_pages(user) -> dict[str, str]:
    """The pages in the one folder of multigpu/feedback/ of `user`'s lab, by name."""
    (folder,) = names_in(user.lab_api("GET", "/contents/multigpu/feedback"))
    path = f"/contents/multigpu/feedback/{folder}"
    return {
        name: user.lab_api("GET", f"{path}/{name}", params={"format": "text"}).json()["content"]
        for name in names_in(user.lab_api("GET", path))
    }


def another_student_cannot_reach_it(hub, exchange: Path, submission: Path) -> None:
    """bo, from his Terminal, tries: nbgrader's fetch_feedback under ann's name (it runs, and
    brings nothing), listing the exchange's feedback folder, and reading ann's page by its name
    in the exchange (which only her submission's secret gives). Nothing of hers reaches him."""
    from nbgrader.utils import notebook_hash

    secret = (submission / "submission_secret.txt").read_text()
    feedback = exchange / COURSE / "feedback"
    page = feedback / (notebook_hash(secret=secret, notebook_id="from_scratch") + ".html")
    assert page.is_file(), sorted(feedback.iterdir())
    tries = {  # what each runs, and whether it should succeed
        "nbgrader's fetch_feedback under ann's name": (
            f"python -m nbgrader fetch_feedback multigpu --course {COURSE} --student ann "
            f"--Exchange.root={exchange}",
            "OPEN",  # it runs, and finds nothing of his to fetch
        ),
        "ann's feedback in his lab": ("ls multigpu/feedback", "shut"),
        "listing the exchange's feedback": (f"ls {feedback}", "shut"),
        "reading ann's page in the exchange": (f"cat {page}", "shut"),
    }
    bo = hub.login("bo")
    bo.start_lab()
    script = 't() { if eval "$2" >/dev/null 2>&1; then echo "OPEN: $1"; else echo "shut: $1"; fi; }'
    script += "".join(
        f"; t {shlex.quote(what)} {shlex.quote(run)}" for what, (run, _) in tries.items()
    )
    shown, _ = bo.terminal(script)
    outcome = {what: state for state, what in re.findall(r"^(OPEN|shut): (.+?)\s*$", shown, re.M)}
    expected = {what: state for what, (_, state) in tries.items()}
    assert outcome == expected, f"bo's Terminal showed:\n{shown}"
    assert "multigpu" not in names_in(bo.lab_api("GET", "/contents"))


def the_student_fetches_feedback(browser: Browser, tmp_path: Path) -> None:
    """The list, refreshed, offers ann's feedback; Fetch Feedback brings it, and the "view
    feedback" link opens its folder in the file browser."""
    submitted = "#submitted_assignments_list .list_item"
    browser.click("#refresh_assignments_list")
    browser.wait_for(submitted, "feedback available to fetch", timeout=120)
    browser.click(submitted + " button", "Fetch Feedback")
    browser.wait_for(submitted, "view feedback", timeout=120)
    browser.click(submitted + " a", "view feedback")
    browser.wait_for(".jp-DirListing-item", "from_scratch.html", timeout=60)
    print(f"the feedback in the file browser: {browser.screenshot(tmp_path / 'feedback.png')}")


def a_student_fetches_and_submits(browser: Browser, hub, tmp_path: Path) -> None:
    log_in(browser, hub, "ann")
    # The student's part of nbgrader, and nothing of the instructor's (formgrader, the course
    # list, Create Assignment: their plugins are off, and their commands do not show).
    assert open_menu(browser, "Nbgrader") == ["Assignment List"]
    browser.press("Escape", "Escape", 27)
    assert palette_finds(browser, "nbgrader") == ["Assignment List"]

    open_menu(browser, "Nbgrader")
    browser.click(ITEMS, "Assignment List")
    browser.wait_for(".lm-TabBar-tab", "Assignments")
    released = "#released_assignments_list .list_item"
    browser.wait_for(released, "multigpu")
    browser.click(released + " button", "Fetch")

    fetched = "#fetched_assignments_list .list_item"
    browser.wait_for(fetched, "multigpu", timeout=120)
    browser.wait_for("#released_assignments_list_placeholder", "no assignments to fetch")
    validate_stub(browser, fetched, tmp_path)
    write_try_gpu(hub)
    browser.click(fetched + " button", "Submit")

    submitted = "#submitted_assignments_list .list_item"
    browser.wait_for(submitted, "multigpu", timeout=120)
    shown = browser.texts(submitted)
    assert any(" UTC" in text for text in shown), shown  # the submission's time
    shot = browser.screenshot(tmp_path / "assignments-list.png")
    print(f"the Assignments list after the submission: {shot}")


def write_try_gpu(hub) -> None:
    """ann's from_scratch becomes the reference solution, saved as the lab saves it."""
    ann = hub.login("ann")
    ann.start_lab()  # running already: this signs her requests into it
    content = json.loads((REPO / "solutions" / "multigpu" / "from_scratch.ipynb").read_text())
    body = json.dumps({"type": "notebook", "content": content})
    saved = ann.lab_api("PUT", "/contents/multigpu/from_scratch.ipynb", data=body)
    assert saved.status_code == 200, saved.text


def validate_stub(browser: Browser, fetched: str, tmp_path: Path) -> None:
    """Open the fetched assignment's notebooks and Validate from_scratch, still the stub:
    nbgrader runs it as autograde will, and its dialog names the checks that failed."""
    browser.click(fetched + " .assignment-notebooks-link", "multigpu")
    rows = json.dumps(fetched + " .nested_list_item")
    browser.evaluate(
        f"[...document.querySelectorAll({rows})].find("
        "r => r.querySelector('.item_name').innerText.trim() === 'from_scratch')"
        ".id = 'from-scratch-row'"
    )
    browser.click("#from-scratch-row button", "Validate")
    browser.wait_for("#validation-message", timeout=300)
    said = browser.texts("#validation-message")[0]
    assert "The following cell failed" in said, said
    assert 'check("allreduce", allreduce)' in said, said
    assert "Success" not in said and "error running the validate command" not in said, said
    print(f"the Validate dialog: {browser.screenshot(tmp_path / 'validate.png')}")
    browser.click(".jp-Dialog button", "Ok")
