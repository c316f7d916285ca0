"""`python -m grader grade --feedback DIR`: a Markdown file per student, with the public checks'
messages and hints, the hidden checks' names and points only, and written again from the JSON
report's stored results when a re-run skips what is graded."""

import dataclasses
import html
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import mistune
import pytest

from grader.exercises.allreduce.private.mistakes import rebinds_list_entries
from grader.load.notebook import read_cells
from grader.manifest import REPO, load_manifest
from grader.report.feedback import inline, item
from grader.report.json_report import read_json
from grader.report.nbgrader_feedback import feedback_page
from tests.conftest import SOLUTIONS, python, write_notebook

MANIFEST = load_manifest()
NOTEBOOK = "from_scratch.ipynb"
WRONG_CHECK = rebinds_list_entries.fails  # the public check the mistake fails
HIDDEN_CHECK = "matches_the_reference_on_random_lists"
COURSE = "multigpu-lab"  # nbgrader_config.py's course id


def grade(*args: str) -> subprocess.CompletedProcess:
    """Run `python -m grader grade ARGS -e allreduce` as an instructor would."""
    return subprocess.run(
        [python(), "-m", "grader", "grade", *args, "-e", "allreduce"],
        capture_output=True,
        text=True,
        timeout=600,
    )


def make_class(root):
    """Two students: ann hands in the reference notebook, ben the same with the catalogued
    mistake `rebinds_list_entries` in a cell of its own at the end."""
    ann = root / "submitted" / "ann" / MANIFEST.assignment
    ann.mkdir(parents=True)
    shutil.copy(SOLUTIONS / NOTEBOOK, ann / NOTEBOOK)
    ben = root / "submitted" / "ben" / MANIFEST.assignment / NOTEBOOK
    write_notebook(ben, *read_cells(SOLUTIONS / NOTEBOOK), rebinds_list_entries.source)
    return root / "submitted"


SECRET = "a secret of ben's submission"
HANDED_IN = "2025-03-01 09:30:00.000000 UTC"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once with --json, --feedback and --nbgrader-feedback; its folder and
    the run. ben's submission came through nbgrader's exchange (its secret and time are there,
    as `nbgrader submit` writes them), ann's was copied in."""
    root = tmp_path_factory.mktemp("feedback")
    submitted = make_class(root)
    (submitted / "ben" / MANIFEST.assignment / "submission_secret.txt").write_text(SECRET)
    (submitted / "ben" / MANIFEST.assignment / "timestamp.txt").write_text(HANDED_IN)
    proc = grade(str(submitted), "--json", str(root / "r.json"), "--feedback", str(root / "fb"),
                 "--nbgrader-feedback", str(root / "course" / "feedback"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return root, proc


def checks_of(root, student: str) -> dict:
    """Return the student's allreduce checks from the JSON report, by name."""
    (result,) = [r for r in read_json(root / "r.json") if r.id == student]
    (exercise,) = result.exercises
    return {c.name: c for c in exercise.checks}


@pytest.mark.slow
def test_one_file_per_student_and_nothing_else(graded):
    root, proc = graded
    assert sorted(p.name for p in (root / "fb").iterdir()) == ["ann.md", "ben.md"]
    assert f"feedback written to {root / 'fb'}" in proc.stdout


@pytest.mark.slow
def test_the_file_gives_the_total_and_each_exercise_score(graded):
    root, _ = graded
    ann = (root / "fb" / "ann.md").read_text()
    ben = (root / "fb" / "ben.md").read_text()
    assert ann.startswith("# Feedback for ann\n")
    assert "**Total: 11/11 points**" in ann
    assert "**Total: 9/11 points**" in ben
    assert "| `allreduce` (Sum across devices, in place) | 9/11 |" in ben


@pytest.mark.slow
def test_a_failed_public_check_shows_what_the_students_own_check_shows(graded):
    root, _ = graded
    text = (root / "fb" / "ben.md").read_text()
    failed = checks_of(root, "ben")[WRONG_CHECK]
    assert not failed.passed and not failed.hidden
    assert f"- ✗ `{WRONG_CHECK}`: failed, 0/2 points" in text
    assert f"  - {failed.message}\n" in text
    assert f"  - hint: {failed.hint}\n" in text
    assert rebinds_list_entries.hint_mentions in text
    # the lines the student's own `python -m grader check` prints about it
    notebook = root / "submitted" / "ben" / MANIFEST.assignment / NOTEBOOK
    check = subprocess.run(
        [python(), "-m", "grader", "check", str(notebook), "-e", "allreduce"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = check.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if WRONG_CHECK in line)
    for said in lines[at + 1 : at + 3]:  # its message and its hint
        assert said.strip() in text


@pytest.mark.slow
def test_passed_public_checks_are_listed_as_passed(graded):
    root, _ = graded
    text = (root / "fb" / "ann.md").read_text()
    for name, c in checks_of(root, "ann").items():
        if not c.hidden:
            assert f"- ✓ `{name}`: passed, {c.points:g}/{c.max_points:g} points" in text
    assert "✗" not in text


@pytest.mark.slow
def test_hidden_checks_show_their_name_and_points_but_not_what_they_said(graded):
    """ben's hidden check saw the rebinding too, and keeps its points, as the public check
    charges for it; what it said names the hidden inputs' values, and is not shown."""
    root, _ = graded
    hidden = checks_of(root, "ben")[HIDDEN_CHECK]
    assert hidden.hidden and hidden.passed and "came back" in hidden.message
    text = (root / "fb" / "ben.md").read_text()
    assert f"- `{HIDDEN_CHECK}`: 2/2 points" in text
    assert hidden.message not in text
    assert "came back" not in text  # the hidden inputs' values it compared
    ann = (root / "fb" / "ann.md").read_text()
    assert f"- `{HIDDEN_CHECK}`: 2/2 points" in ann


@pytest.mark.slow
def test_loading_notes_are_there_without_the_graders_paths(graded):
    root, _ = graded
    text = (root / "fb" / "ben.md").read_text()
    assert "## While loading your notebooks" in text
    assert "concise.ipynb is missing from your submission" in text
    assert str(root) not in text


@pytest.mark.slow
def test_a_rerun_from_the_json_report_still_writes_every_file(graded):
    root, _ = graded
    before = {p.name: p.read_text() for p in (root / "fb").iterdir()}
    seconds = {r.id: r.seconds for r in read_json(root / "r.json")}
    again = root / "fb-again"
    proc = grade(str(root / "submitted"), "--json", str(root / "r.json"), "--feedback", str(again))
    assert proc.returncode == 0, proc.stderr
    assert {r.id: r.seconds for r in read_json(root / "r.json")} == seconds  # not graded again
    assert {p.name: p.read_text() for p in again.iterdir()} == before
    assert f"feedback written to {again}" in proc.stdout


@pytest.mark.slow
def test_a_file_given_as_the_folder_is_refused_before_grading(tmp_path):
    submitted = make_class(tmp_path)
    taken = tmp_path / "taken.md"
    taken.write_text("not a folder\n")
    proc = grade(str(submitted), "--json", str(tmp_path / "r.json"), "--feedback", str(taken))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --feedback {taken} is a file, not a folder"
    assert "grading" not in proc.stdout
    assert not (tmp_path / "r.json").exists()
    assert taken.read_text() == "not a folder\n"


def page_text(page: str) -> str:
    """Return the text a browser shows of an HTML page's body (tags dropped)."""
    body = page.split("<body>", 1)[1]
    return html.unescape(re.sub(r"<[^>]+>", "", body))


@pytest.mark.slow
def test_nbgrader_feedback_is_a_page_per_notebook_beside_the_secret_and_time(graded):
    """What `nbgrader release_feedback` reads: feedback/<student>/<assignment>/, a page for
    each notebook handed in, readable by all (release copies its mode into the exchange), and
    the submission's secret and time, the instructor's alone."""
    root, proc = graded
    folder = root / "course" / "feedback" / "ben" / MANIFEST.assignment
    assert sorted(p.name for p in folder.iterdir()) == [
        "from_scratch.html", "submission_secret.txt", "timestamp.txt"
    ]  # fmt: skip
    assert (folder / "submission_secret.txt").read_text() == SECRET
    assert (folder / "timestamp.txt").read_text() == HANDED_IN
    assert (folder / "from_scratch.html").stat().st_mode & 0o777 == 0o644
    assert (folder / "submission_secret.txt").stat().st_mode & 0o077 == 0
    said = f"feedback for nbgrader's exchange written to {root / 'course' / 'feedback'}"
    assert said in proc.stdout


@pytest.mark.slow
def test_the_page_shows_what_the_feedback_file_says(graded):
    root, _ = graded
    page = root / "course" / "feedback" / "ben" / MANIFEST.assignment / "from_scratch.html"
    page = page.read_text(encoding="utf-8")
    assert page.startswith('<!DOCTYPE html>\n<html lang="en">')
    assert "<title>Feedback for ben: from_scratch.ipynb</title>" in page
    text = page_text(page)
    failed = checks_of(root, "ben")[WRONG_CHECK]
    assert "Total: 9/11 points" in text
    assert f"✗ {WRONG_CHECK}: failed, 0/2 points" in text
    assert failed.message in text
    assert failed.hint.replace("`", "") in text  # (its `code` shown as code)
    assert f"{HIDDEN_CHECK}: 2/2 points" in text
    assert checks_of(root, "ben")[HIDDEN_CHECK].message not in text
    assert "<script" not in page


@pytest.mark.slow
def test_a_submission_that_did_not_come_through_the_exchange_gets_no_page_and_a_line(graded):
    root, proc = graded
    assert not (root / "course" / "feedback" / "ann").exists()
    assert "ann: no feedback for nbgrader's exchange, as " in proc.stderr
    assert "only work handed in through the exchange" in proc.stderr


@pytest.mark.slow
def test_the_page_is_in_the_submissions_language(graded):
    """A Chinese submission (its notebooks, or `--lang zh_CN` for the English ones) gets its
    page in Chinese."""
    root, _ = graded
    (ben,) = [r for r in read_json(root / "r.json") if r.id == "ben"]
    chinese = feedback_page(dataclasses.replace(ben, language="zh_CN"), {}, NOTEBOOK, MANIFEST)
    assert chinese.startswith('<!DOCTYPE html>\n<html lang="zh-CN">')
    assert "<title>给 ben 的反馈：from_scratch.ipynb</title>" in chinese
    assert "总分：9/11 分" in page_text(chinese)


@pytest.mark.slow
def test_nbgrader_releases_the_page_and_the_students_fetch_brings_it(graded, tmp_path):
    """nbgrader's own release_feedback and fetch_feedback, with the student's side as
    `nbgrader submit` left it (its cache): the page reaches the student's assignment folder,
    under feedback/<time of the submission>/."""
    root, _ = graded
    course = root / "course"
    shutil.copy(REPO / "nbgrader_config.py", course)
    exchange, cache, work = tmp_path / "exchange", tmp_path / "cache", tmp_path / "work"
    exchange.mkdir()
    env = dict(os.environ, HUB_USER_PREFIX=f"t{secrets.token_hex(3)}-")  # no such accounts
    nbgrader = [str(Path(python()).with_name("nbgrader"))]
    released = subprocess.run(
        [*nbgrader, "release_feedback", MANIFEST.assignment, f"--Exchange.root={exchange}"],
        cwd=course, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert released.returncode == 0, released.stderr
    assert "Releasing feedback for student 'ben'" in released.stderr
    assert "Feedback of ben is readable by every account that knows its name" in released.stderr
    submission = cache / COURSE / f"ben+{MANIFEST.assignment}+{HANDED_IN}"
    submission.mkdir(parents=True)
    shutil.copy(SOLUTIONS / NOTEBOOK, submission)
    (submission / "submission_secret.txt").write_text(SECRET)
    work.mkdir()
    fetched = subprocess.run(
        [*nbgrader, "fetch_feedback", MANIFEST.assignment, f"--course={COURSE}",
         f"--Exchange.root={exchange}", f"--Exchange.cache={cache}"],
        cwd=work, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    page = work / MANIFEST.assignment / "feedback" / HANDED_IN / "from_scratch.html"
    given = course / "feedback" / "ben" / MANIFEST.assignment / "from_scratch.html"
    assert page.read_text(encoding="utf-8") == given.read_text(encoding="utf-8")


def shown(markdown: str) -> str:
    """Return the text a Markdown viewer shows for `markdown` (tags dropped)."""
    rendered = mistune.create_markdown(plugins=["strikethrough", "table"])(markdown)
    return html.unescape(re.sub(r"<[^>]+>", "", str(rendered))).strip()


@pytest.mark.parametrize(
    "text",
    [
        "__init__ got *args and **kwargs",
        "a <lambda> & &amp; x",
        "[x](y) is no link",
        "~1e-5 is ~~close~~",
        "C:\\path\\ ends in \\",
        "`` a backtick ` left over",
        "- not a list",
        "1. not a list either",
        "# not a heading",
        "> not a quote",
        "2 * 3 and [[3., 3.]] and copy_(x) stay as they are",
    ],
)
def test_text_shows_as_written(text):
    (line,) = item(text, "")
    assert shown(line) == text


def test_text_markdown_leaves_alone_is_not_escaped():
    text = "with 3 tensors, data[0] and 2 * x came back [[3., 3.]]: use data[i].copy_(...)"
    assert item(text, "") == [f"- {text}"]


def test_a_table_cell_keeps_its_bars_and_a_message_its_lines():
    cells = [inline("x | y", table=True), inline("one\ntwo", table=True)]
    table = f"| a | b |\n|---|---|\n| {cells[0]} | {cells[1]} |"
    rendered = str(mistune.create_markdown(plugins=["table"])(table))
    assert re.findall(r"<td>(.*?)</td>", rendered) == ["x | y", "one two"]
    lines = item("Traceback:\n  File x, line 2\n```\nboom", "  ", "hint: ")
    assert lines[0] == "  - hint:"
    rendered = str(mistune.create_markdown()("\n".join(lines)))
    (code,) = re.findall(r"<li>hint:\s*<pre><code[^>]*>(.*?)</code></pre>", rendered, re.S)
    assert html.unescape(code) == "Traceback:\n  File x, line 2\n```\nboom\n"
