"""Feedback that nbgrader's exchange hands back to each student: `grade --nbgrader-feedback DIR`.

For a submission that came through the exchange (`<student>/<assignment>/` of nbgrader's
`submitted/`, holding the `submission_secret.txt` that `nbgrader submit` wrote and `collect`
brought along), it writes what `nbgrader release_feedback` takes from the course's `feedback/`
folder: `DIR/<student>/<assignment>/<notebook>.html` for each notebook handed in, and beside
them the submission's secret and time. `release_feedback` puts each page into the exchange
under a name made from that secret, which only the student's own lab holds; their Fetch
Feedback button (the Assignments list) then brings it into their lab, as
`<assignment>/feedback/<time of the submission>/<notebook>.html`.

A page for each notebook, since the list offers feedback only when every notebook handed in has
its page. Each gives the whole submission's total and table of scores, then the checks of that
notebook's exercises (every exercise's, for a notebook that is not one of the lab's), and the
notes from loading: the Markdown feedback file's text (grader.report.feedback), in the
submission's language, made into HTML. The pages are readable by all (0644): release copies a
page's mode into the exchange, where the student's account reads it; the folder they are
written in stays as closed as the course.
"""

import html
import os
from pathlib import Path

from grader.base.results import SubmissionResult
from grader.manifest import Manifest
from grader.report.feedback import feedback_markdown, feedback_title
from grader.report.paths import write_report
from labtext import _, speaking

SECRET = "submission_secret.txt"  # nbgrader's names, in each submission it collects
TIMESTAMP = "timestamp.txt"
PAGE_MODE = 0o644
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em;
       line-height: 1.45; }
table { border-collapse: collapse; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.6em; text-align: left; }
code, pre { background: #f4f4f4; }
pre { padding: 0.5em; overflow-x: auto; white-space: pre-wrap; }
"""


def handed_in(result: SubmissionResult, assignment: str) -> Path | None:
    """Return the folder nbgrader's collect made for the submission, `<student>/<assignment>/`
    with its secret and time; None for a submission that did not come through the exchange."""
    path = Path(result.path)
    for folder in (path / assignment, path):
        if folder.name == assignment and all((folder / f).is_file() for f in (SECRET, TIMESTAMP)):
            return folder
    return None


def not_from_the_exchange(result: SubmissionResult, assignment: str) -> str:
    """The line that says why a submission gets no pages."""
    return _(
        "{id}: no feedback for nbgrader's exchange, as {path} lacks {assignment}/{secret} "
        "and {assignment}/{timestamp}, which `nbgrader submit` writes and `nbgrader collect` "
        "brings along: only work handed in through the exchange gets its feedback back that way"
    ).format(
        id=result.id, path=result.path, assignment=assignment, secret=SECRET, timestamp=TIMESTAMP
    )


def feedback_page(
    result: SubmissionResult, titles: dict[str, str], notebook: str, manifest: Manifest
) -> str:
    """Return the HTML page of one notebook of a submission, in the submission's language."""
    import mistune  # (nbconvert's, which nbgrader needs)

    ours = notebook in manifest.notebooks
    exercises = [ex.id for ex in manifest.in_notebook(notebook)] if ours else None
    text = feedback_markdown(result, titles, notebook, exercises)
    body = mistune.create_markdown(escape=True, plugins=["strikethrough", "table"])(text)
    with speaking(result.language):
        title = feedback_title(result, notebook)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="{result.language.replace("_", "-")}">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
        f"<body>\n{body}</body>\n</html>\n"
    )


def write_nbgrader_feedback(
    result: SubmissionResult, folder: Path, manifest: Manifest, titles: dict[str, str]
) -> list[Path]:
    """Write one submission's pages, secret and time into `folder/<student>/<assignment>/`
    (a page of a notebook no longer handed in is removed); return the pages, none for a
    submission that did not come through the exchange."""
    source = handed_in(result, manifest.assignment)
    if source is None:
        return []
    into = Path(folder) / source.parent.name / manifest.assignment
    into.mkdir(parents=True, exist_ok=True)
    pages = []
    for notebook in sorted(p.name for p in source.glob("*.ipynb")):
        page = into / f"{Path(notebook).stem}.html"
        write_report(page, feedback_page(result, titles, notebook, manifest))
        os.chmod(page, PAGE_MODE)
        pages.append(page)
    for old in set(into.glob("*.html")) - set(pages):
        old.unlink()
    for name in (SECRET, TIMESTAMP):  # the instructor's alone, as in submitted/
        write_report(into / name, (source / name).read_text(encoding="utf-8"))
        os.chmod(into / name, 0o600)
    return pages
