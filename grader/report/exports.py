"""The other forms of a class's results: a CSV gradebook, Gradescope files, nbgrader's
gradebook, a summary table."""

import csv
import io
import json
import unicodedata
from pathlib import Path

from grader.base.results import SubmissionResult
from grader.manifest import Manifest
from grader.report.paths import write_report
from grader.report.text import check_said
from labtext import _, speaking


def gradebook_csv(results: list[SubmissionResult], manifest: Manifest) -> str:
    """Return the gradebook: one row per student, one column per exercise, then the total."""
    ids = [ex.id for ex in manifest.exercises]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student", *ids, "total", "max_score"])
    for r in results:
        scores = {e.name: e.score for e in r.exercises}
        writer.writerow(
            [
                r.id,
                *(f"{scores[i]:g}" if i in scores else "" for i in ids),
                f"{r.score:g}",
                f"{r.max_score:g}",
            ]
        )
    return out.getvalue()


def gradescope_results(result: SubmissionResult) -> dict:
    """Return Gradescope's results.json for one submission, its words in the submission's
    language; hidden checks stay hidden."""
    with speaking(result.language):
        passed, hint = _("passed"), _("hint: {hint}")
        said = {id(c): check_said(c) for e in result.exercises for c in e.checks}
    tests = []
    for number, exercise in enumerate(result.exercises, start=1):
        for sub, c in enumerate(exercise.checks, start=1):
            message = said[id(c)]
            output = (
                (passed + (f"\n{message}" if message else ""))
                if c.passed
                else f"{message}\n" + hint.format(hint=c.hint)
            )
            tests.append(
                {
                    "name": f"{exercise.name}: {c.name}",
                    "number": f"{number}.{sub}",
                    "score": c.points,
                    "max_score": c.max_points,
                    "status": "passed" if c.passed else "failed",
                    "output": output,
                    "tags": [exercise.name],
                    "visibility": "hidden" if c.hidden else "visible",
                }
            )
    return {
        "score": result.score,
        "execution_time": round(result.seconds),
        "output": "\n".join(map(str, result.notes)),
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def write_gradescope(result: SubmissionResult, folder: Path) -> Path:
    """Write `folder/<id>/results.json` for one submission; return its path."""
    path = Path(folder) / result.id / "results.json"
    write_report(path, json.dumps(gradescope_results(result), indent=2) + "\n")
    return path


def summary_table(
    results: list[SubmissionResult], manifest: Manifest, points: dict[str, float]
) -> str:
    """Return, per exercise, the mean score and how many submissions got full marks (of
    `points`, what each exercise is worth)."""
    if not results:
        return _("no submissions")
    rows = [(_("exercise"), _("mean"), _("max"), _("full marks"))]
    n = len(results)
    for ex in manifest.exercises:
        scores = [e.score for r in results for e in r.exercises if e.name == ex.id]
        if scores:
            full = sum(s == points[ex.id] for s in scores)
            rows.append(
                (
                    ex.id,
                    f"{sum(scores) / len(scores):.1f}",
                    f"{points[ex.id]:g}",
                    f"{full}/{len(scores)}",
                )
            )
    totals = [r.score for r in results]
    full = sum(r.score == r.max_score for r in results)
    rows.append((_("total"), f"{sum(totals) / n:.1f}", f"{results[0].max_score:g}", f"{full}/{n}"))
    widths = [max(shown_width(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(
            padded(cell, w, left=i == 0)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def shown_width(text: str) -> int:
    """Return how many columns a terminal gives `text`: two for a wide (Chinese) character."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def padded(cell: str, width: int, left: bool) -> str:
    """Return `cell` padded with spaces to `width` columns, on the right if `left`."""
    pad = " " * max(0, width - shown_width(cell))
    return cell + pad if left else pad + cell


class GradebookError(ValueError):
    """nbgrader's gradebook cannot take the scores (it is missing, or lacks the assignment)."""


def check_nbgrader_gradebook(path: Path, manifest: Manifest) -> None:
    """Raise GradebookError, saying what to do, unless `path` is an nbgrader gradebook that
    knows the assignment and every exercise's check cell."""
    setup = _(
        "run `nbgrader generate_assignment {assignment}` in the course folder "
        "first: it records the notebooks and their graded cells"
    ).format(assignment=manifest.assignment)
    if not Path(path).is_file():
        raise GradebookError(
            _("there is no nbgrader gradebook at {path}; {setup}").format(path=path, setup=setup)
        )
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{Path(path).resolve()}") as gb:
        try:
            assignment = gb.find_assignment(manifest.assignment)
        except MissingEntry:
            raise GradebookError(
                _("the gradebook {path} has no assignment {assignment}; {setup}").format(
                    path=path, assignment=repr(manifest.assignment), setup=setup
                )
            ) from None
        cells = {(nb.name, cell.name) for nb in assignment.notebooks for cell in nb.grade_cells}
        for ex in manifest.exercises:
            if (Path(ex.notebook).stem, f"{ex.id}-checks") not in cells:
                raise GradebookError(
                    _(
                        "the gradebook {path} has no graded cell {cell} in {notebook}; {setup}"
                    ).format(path=path, cell=f"{ex.id}-checks", notebook=ex.notebook, setup=setup)
                )


def write_nbgrader_gradebook(
    results: list[SubmissionResult], path: Path, manifest: Manifest
) -> None:
    """Put each exercise's score into nbgrader's gradebook, as the automatic score of its
    check cell (a manual score an instructor gave stays in force)."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{Path(path).resolve()}") as gb:
        for r in results:
            gb.update_or_create_student(r.id)
            try:
                gb.find_submission(manifest.assignment, r.id)
            except MissingEntry:
                gb.add_submission(manifest.assignment, r.id)
            for e in r.exercises:
                ex = manifest.exercise(e.name)
                cell = f"{ex.id}-checks"
                grade = gb.find_grade(cell, Path(ex.notebook).stem, manifest.assignment, r.id)
                grade.auto_score = e.score
            gb.db.commit()
