"""The JSON report of a grade (docs/grading.md lists its fields): written, and read back."""

import json
from dataclasses import asdict
from pathlib import Path

from grader.base.results import SubmissionResult
from grader.report.paths import readable_report, write_report


def write_json(results: list[SubmissionResult], path: Path, run: dict | None = None) -> None:
    """Write the JSON report (docs/grading.md lists its fields), with `run`, how it was
    graded, where given."""
    payload = ({"run": run} if run else {}) | {"submissions": [asdict(r) for r in results]}
    write_report(path, json.dumps(payload, indent=2) + "\n")


def read_json(path: Path) -> list[SubmissionResult]:
    """Read a JSON report back; an unreadable file gives no results (they will be graded),
    and so does a stream (standard output, a pipe, a device), which is never read."""
    if not readable_report(path):
        return []
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return [SubmissionResult.from_dict(s) for s in data["submissions"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
