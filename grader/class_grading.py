"""Grade a class: many submissions side by side, every result kept the moment it is in.

- `expand` turns the command line into submissions; an nbgrader `submitted/` folder (one
  folder per student) gives one submission per student.
- Submissions run `jobs` at a time, each in its own fenced children (grader.grading); while
  the cores sit idle (a submission whose ranks deadlocked waits for the verdict), the fast
  path starts one more, up to twice `jobs` (grader.sandbox.speedups' room).
- After each one finishes, the JSON report, the CSV gradebook, its Gradescope file and its
  feedback file are rewritten atomically (grader.report.outputs), so an interrupted run
  keeps everything already graded.
- A submission whose fingerprint (notebooks, grader, options) matches one in the existing
  JSON report is not graded again, unless asked (a report that goes to standard output, a
  device or a FIFO is never read back, and is written once, at the end: see
  grader.report.paths).
- At the very end every output is written once more from the results held in memory, so
  nothing a submission's code wrote into them survives.
"""

import contextlib
import dataclasses
import hashlib
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from grader.base.results import SubmissionResult
from grader.grading import (
    AtOnce,
    GradeOptions,
    class_side_by_side,
    default_threads,
    grade_submission,
    notebooks_at_once,
    select_exercises,
    stop_all_children,
)
from grader.load.submission import Submission, find_submission, set_aside_beside
from grader.manifest import REPO, Manifest
from grader.report.json_report import read_json
from grader.report.outputs import Outputs
from labtext import _


def is_class_folder(path: Path, manifest: Manifest) -> bool:
    """Return True for a folder of students' folders (such as nbgrader's `submitted/`)."""
    if not path.is_dir() or (path / manifest.assignment).is_dir():
        return False
    if any((path / nb).is_file() for nb in manifest.notebooks):
        return False
    return any(
        (d / manifest.assignment).is_dir() or any((d / nb).is_file() for nb in manifest.notebooks)
        for d in path.iterdir()
        if d.is_dir()
    )


def expand(paths: list[str | Path], manifest: Manifest) -> list[Submission]:
    """Return the submissions the given paths stand for, in order, ids made unique."""
    subs: list[Submission] = []
    for given in paths:
        path = Path(given)
        if is_class_folder(path, manifest):
            subs += [
                find_submission(d, manifest)
                for d in sorted(path.iterdir())
                if d.is_dir() and not d.name.startswith(".")
            ]
            say_set_aside(path, manifest)
        else:
            subs.append(find_submission(path, manifest))
    seen: set[str] = set()
    for sub in subs:
        base, n = sub.id, 2
        while sub.id in seen:
            sub.id, n = f"{base}-{n}", n + 1
        seen.add(sub.id)
    return subs


def say_set_aside(class_folder: Path, manifest: Manifest, stream=None) -> None:
    """Name, one line each, the submissions that nbgrader's collect set aside beside this
    `submitted/` folder, handed in by one student's account as another student (they are not
    graded: see grader.load.submission.SET_ASIDE)."""
    for line in set_aside_beside(class_folder, manifest.assignment):
        print(line, file=stream or sys.stderr, flush=True)


def one_slice(subs: list[Submission], index: int, count: int) -> list[Submission]:
    """The submissions of slice `index` of `count` (`grade --shard index/count`): the class's
    ids in sorted order, every `count`-th from the `index`-th, so that a class always splits
    the same way and the slices differ by one submission at most."""
    order = sorted(s.id for s in subs)
    mine = set(order[index::count])
    return [s for s in subs if s.id in mine]


@cache
def grader_fingerprint() -> str:
    """Return a hash of the grader's own files: a changed check means new results."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "grader").rglob("*")):
        if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(REPO)).encode())
            digest.update(path.read_bytes())
    for path in sorted((REPO / "i18n").rglob("*.po")):  # the messages' translations
        digest.update(str(path.relative_to(REPO)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def fingerprint(sub: Submission, options: dict) -> str:
    """Return what a result depends on: the notebooks, the grader and the options."""
    digest = hashlib.sha256(grader_fingerprint().encode())
    digest.update(repr(sorted(options.items())).encode())
    digest.update(repr([ex.id for ex in sub.exercises]).encode())
    digest.update(sub.language.encode())  # the language its messages are in
    for name, path in sorted(sub.notebooks.items()):
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class Progress:
    """Submissions done, running and left: one updating line on a terminal, else a line each."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.stream = total, stream
        self.live = hasattr(stream, "isatty") and stream.isatty()

    def show(self, done: int, running: int, last: SubmissionResult | None = None) -> None:
        left = self.total - done - running
        counts = _("{done}/{total} graded, {running} running, {left} left").format(
            done=done, total=self.total, running=running, left=left
        )
        if self.live:
            width = 24
            filled = round(width * done / self.total) if self.total else width
            print(
                f"\r[{'#' * filled}{'-' * (width - filled)}] {counts}",
                end="",
                file=self.stream,
                flush=True,
            )
            if done == self.total:
                print(file=self.stream)
        elif last is not None:
            line = _("{id}: {score}/{total} ({counts})").format(
                id=last.id, score=f"{last.score:g}", total=f"{last.max_score:g}", counts=counts
            )
            print(line, file=self.stream, flush=True)


def run_record(
    subs: list[Submission],
    options: dict,
    exercises: list[str] | None,
    shard: tuple[int, int] | None,
) -> dict:
    """What the JSON report says of how the class was graded (`merge` reads it)."""
    return {
        "grader": grader_fingerprint(),
        "options": options,
        "exercises": sorted(exercises) if exercises else None,
        "class": [s.id for s in subs],
        "shard": list(shard or (0, 1)),
    }


def kept_and_todo(
    subs: list[Submission],
    previous: dict[str, SubmissionResult],
    options: dict,
    regrade: bool,
) -> tuple[dict[str, SubmissionResult], list[tuple[Submission, str]]]:
    """Split `subs` into the results of the previous report that still hold (same
    fingerprint, and no regrade asked for) and the submissions to grade, with their
    fingerprints."""
    results: dict[str, SubmissionResult] = {}
    todo: list[tuple[Submission, str]] = []
    for sub in subs:
        mark = fingerprint(sub, options)
        old = previous.get(sub.id)
        if not regrade and old is not None and old.fingerprint == mark:
            results[sub.id] = old
        else:
            todo.append((sub, mark))
    return results, todo


@dataclass(frozen=True)
class ClassOptions:
    """How a class is graded: each submission as `grading` says, `jobs` at a time; every one
    again where `regrade`, else only those whose fingerprint changed; only `exercises`
    (ids) where given; only the slice `shard` (index, count) of the class where given."""

    grading: GradeOptions = GradeOptions()
    jobs: int = 1
    regrade: bool = False
    exercises: list[str] | None = None
    shard: tuple[int, int] | None = None


class ClassRun:
    """The submissions of one `grade_class` call being graded side by side: those left to
    grade, the results so far, and what the grading threads share."""

    def __init__(
        self,
        subs: list[Submission],
        todo: list[tuple[Submission, str]],
        results: dict[str, SubmissionResult],
        options: ClassOptions,
    ) -> None:
        self.subs, self.todo, self.results, self.jobs = subs, todo, results, options.jobs
        self.ended = 0  # submissions graded so far in this run
        self.counting = threading.Lock()
        # each submission's options: its children's threads and notebooks at once are the
        # class's to say (see at_once_now)
        self.at_once = AtOnce(self.at_once_now())
        self.grading = dataclasses.replace(
            options.grading, threads=default_threads(options.jobs), at_once=self.at_once
        )

    def at_once_now(self) -> int:
        """The notebooks of a submission graded at once: the cores shared among the
        submissions not yet graded (those graded now and those waiting), at most `jobs` (so
        the last ones of a class get the cores the others leave)."""
        return notebooks_at_once(max(1, min(self.jobs, len(self.todo) - self.ended)))

    def ordered(self) -> list[SubmissionResult]:
        """The results so far, in the order of the submissions."""
        return [self.results[s.id] for s in self.subs if s.id in self.results]

    def grade(self, job: tuple[Submission, str]) -> SubmissionResult:
        """Grade one submission (in a thread of its own), timed and marked with its
        fingerprint."""
        sub, mark = job
        began = time.monotonic()
        try:
            result = grade_submission(sub, self.grading)
        finally:
            with self.counting:
                self.ended += 1
                self.at_once.now = self.at_once_now()
        result.seconds, result.fingerprint = time.monotonic() - began, mark
        return result

    def run(
        self, outputs: Outputs, show: Callable[[int, int, SubmissionResult | None], None]
    ) -> list[SubmissionResult]:
        """Grade what is left, writing `outputs` as each result comes in, and once more at
        the end (or on Ctrl-C or a failure, with what is done)."""
        show(len(self.results), 0, None)
        finishing = class_side_by_side(self.grade, self.todo, self.jobs)
        try:
            with contextlib.closing(finishing):
                for future, running in finishing:
                    result = future.result()
                    self.results[result.id] = result
                    outputs.write(self.ordered(), result)
                    show(len(self.results), running, result)
        except BaseException:  # Ctrl-C or a failure of the grader itself: keep what is done
            stop_all_children()
            outputs.write(self.ordered(), None)
            raise
        outputs.write(self.ordered(), None)
        return self.ordered()


def grade_class(
    subs: list[Submission],
    outputs: Outputs,
    options: ClassOptions = ClassOptions(),
    progress: Callable[[int, int, SubmissionResult | None], None] | None = None,
) -> list[SubmissionResult]:
    """Grade every submission as `options` say (see the module docstring), and return the
    results in order; `progress(done, running, last)` is told of each (a bar by default)."""
    fingerprinted = options.grading.fingerprinted()
    outputs.run = run_record(subs, fingerprinted, options.exercises, options.shard)
    if options.shard:
        subs = one_slice(subs, *options.shard)
    subs = [select_exercises(sub, options.exercises) for sub in subs]
    previous = {r.id: r for r in read_json(outputs.json)} if outputs.json else {}
    results, todo = kept_and_todo(subs, previous, fingerprinted, options.regrade)
    show = progress or Progress(len(subs)).show
    return ClassRun(subs, todo, results, options).run(outputs, show)
