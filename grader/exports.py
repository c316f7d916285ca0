"""The other forms of a class's results: a CSV gradebook, Gradescope files, a summary table."""

import csv
import io
import json
from pathlib import Path

from grader.manifest import Manifest
from grader.report import SubmissionResult, write_atomically


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
    """Return Gradescope's results.json for one submission; hidden checks stay hidden."""
    tests = []
    for number, exercise in enumerate(result.exercises, start=1):
        for sub, c in enumerate(exercise.checks, start=1):
            output = "passed" if c.passed else f"{c.message}\nhint: {c.hint}"
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
        "output": "\n".join(result.notes),
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def write_gradescope(result: SubmissionResult, folder: Path) -> Path:
    """Write `folder/<id>/results.json` for one submission; return its path."""
    path = Path(folder) / result.id / "results.json"
    write_atomically(path, json.dumps(gradescope_results(result), indent=2) + "\n")
    return path


def summary_table(results: list[SubmissionResult], manifest: Manifest) -> str:
    """Return, per exercise, the mean score and how many submissions got full marks."""
    if not results:
        return "no submissions"
    rows = [("exercise", "mean", "max", "full marks")]
    n = len(results)
    for ex in manifest.exercises:
        scores = [e.score for r in results for e in r.exercises if e.name == ex.id]
        if scores:
            full = sum(s == ex.points for s in scores)
            rows.append(
                (
                    ex.id,
                    f"{sum(scores) / len(scores):.1f}",
                    f"{ex.points:g}",
                    f"{full}/{len(scores)}",
                )
            )
    totals = [r.score for r in results]
    full = sum(r.score == r.max_score for r in results)
    rows.append(("total", f"{sum(totals) / n:.1f}", f"{results[0].max_score:g}", f"{full}/{n}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )
