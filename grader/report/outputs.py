"""Where a class's results go, and writing them: the JSON report, the CSV gradebook,
Gradescope's files, nbgrader's gradebook and feedback pages, and the feedback files. A
report that goes to a stream is written once, at the end (grader.report.paths)."""

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from grader.base.results import SubmissionResult
from grader.manifest import load_manifest
from grader.report.exports import gradebook_csv, write_gradescope, write_nbgrader_gradebook
from grader.report.feedback import check_feedback_folder, feedback_markdown, write_feedback
from grader.report.json_report import write_json
from grader.report.nbgrader_feedback import not_from_the_exchange, write_nbgrader_feedback
from grader.report.paths import (
    is_stdout,
    is_stream,
    standard_stream,
    validate_report_paths,
    write_report,
)
from labtext import _


@dataclass
class Outputs:
    """Where the results go; None means not asked for."""

    json: Path | None = None
    csv: Path | None = None
    gradescope: Path | None = None
    nbgrader: Path | None = None  # nbgrader's gradebook.db
    feedback: Path | None = None  # a folder: a Markdown file per student
    run: dict | None = None  # what the JSON report says of how it was graded (`merge` reads it)
    streamed: set[Path] = field(default_factory=set)  # the streams written (once each)
    # a folder: nbgrader's feedback/, a page per notebook for `nbgrader release_feedback`
    nbgrader_feedback: Path | None = None
    unreleasable: dict[str, str] = field(default_factory=dict)  # id: why it has no pages

    def write(self, results: list[SubmissionResult], just_done: SubmissionResult | None) -> None:
        """Rewrite the reports; write the Gradescope and feedback files of `just_done` (all of
        them if None). A report that goes to a stream (standard output, a device, a FIFO) is
        written once, at the end (`just_done` None): a stream cannot be rewritten."""
        manifest = load_manifest()
        final = just_done is None

        def now(path: Path) -> bool:
            """Whether to write `path` now: a file each time, a stream once at the end."""
            if not is_stream(path):
                return True
            if not final or path in self.streamed:
                return False
            self.streamed.add(path)
            return True

        if self.json and now(self.json):
            write_json(results, self.json, self.run)
        if self.csv and now(self.csv):
            write_report(self.csv, gradebook_csv(results, manifest))
        if self.gradescope:
            for r in results if final else [just_done]:
                write_gradescope(r, self.gradescope)
        if self.nbgrader:
            done = results if final else [just_done]
            write_nbgrader_gradebook(done, self.nbgrader, manifest)
        if self.nbgrader_feedback:
            titles = {ex.id: ex.title for ex in manifest.exercises}
            for r in results if final else [just_done]:
                if write_nbgrader_feedback(r, self.nbgrader_feedback, manifest, titles):
                    self.unreleasable.pop(r.id, None)
                else:
                    self.unreleasable[r.id] = not_from_the_exchange(r, manifest.assignment)
        if self.feedback:
            titles = {ex.id: ex.title for ex in manifest.exercises}
            if standard_stream(self.feedback) is not None:
                if now(self.feedback):  # every submission's, one after the other
                    text = "\n".join(feedback_markdown(r, titles) for r in results)
                    write_report(self.feedback, text)
                return
            for r in results if final else [just_done]:
                write_feedback(r, self.feedback, titles)

    def say_nbgrader_feedback(self, assignment: str, terminal: TextIO) -> None:
        """Say which submissions got no pages for nbgrader's exchange (on standard error),
        and where the pages went, with the command that releases them."""
        for why in self.unreleasable.values():
            print(why, file=sys.stderr)
        if self.nbgrader_feedback:
            said = _(
                "feedback for nbgrader's exchange written to {path}: `nbgrader "
                "release_feedback {assignment}` hands it to the students"
            )
            print(said.format(path=self.nbgrader_feedback, assignment=assignment), file=terminal)

    def paths(self) -> tuple[dict[str, Path | None], ...]:
        """Return the paths given, by option, for `validate_report_paths`: files, folders,
        streams (a folder or standard output), databases."""
        return (
            {"--json": self.json, "--csv": self.csv},
            {"--gradescope": self.gradescope, "--nbgrader-feedback": self.nbgrader_feedback},
            {"--feedback": self.feedback},
            {"--gradebook": self.nbgrader},
        )

    def check(self) -> None:
        """Raise ReportPathError (FeedbackError for the feedback folder), saying what to do,
        unless every report can be written."""
        validate_report_paths(*self.paths())
        if self.feedback and standard_stream(self.feedback) is None:
            check_feedback_folder(self.feedback)

    def to_stdout(self) -> bool:
        """Return True where a report goes to standard output."""
        return any(is_stdout(p) for p in (self.json, self.csv, self.feedback))
