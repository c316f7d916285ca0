"""`python -m grader grade --feedback DIR`: a Markdown file per student, with the public checks'
messages and hints, the hidden checks' names and points only, and written again from the JSON
report's stored results when a re-run skips what is graded."""

import html
import re
import shutil
import subprocess

import mistune
import pytest

from grader.exercises.allreduce.private.mistakes import rebinds_list_entries
from grader.load.notebook import read_cells
from grader.manifest import load_manifest
from grader.report.feedback import inline, item
from grader.report.json_report import read_json
from tests.conftest import SOLUTIONS, python, write_notebook

MANIFEST = load_manifest()
NOTEBOOK = "from_scratch.ipynb"
WRONG_CHECK = rebinds_list_entries.fails  # the public check the mistake fails
HIDDEN_CHECK = "matches_the_reference_on_random_lists"


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


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once with --json and --feedback; its folder and the run."""
    root = tmp_path_factory.mktemp("feedback")
    submitted = make_class(root)
    proc = grade(str(submitted), "--json", str(root / "r.json"), "--feedback", str(root / "fb"))
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
