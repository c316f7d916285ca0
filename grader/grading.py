"""Grade one submission, as a list of steps:

    find_submission       grader.load.submission: its notebooks, and the exercises in them
    exercise_checks       grader.judge.registry: the checks of each exercise (hidden too)
    run_isolated          grader.sandbox.supervisor: the cases, in fenced children
    time_against_the_reference
                          grader.sandbox.retiming: cases stopped for time, against the reference
    judge_reported        here, with grader.judge.verdicts: a verdict per check, in this process
    submission_result     grader.report.text: points, hints and notes

Student code runs only in the children; this process sends them the cases and their inputs,
reads back plain data, and decides every verdict.
"""

import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import labtext
from grader import pace
from grader.api import Check, Context
from grader.base.grading_devices import DEVICES, grading_devices
from grader.base.limits import Limits
from grader.base.protocol import Note
from grader.base.results import ExerciseResult, SubmissionResult, submission_result
from grader.judge.registry import diagnoser, exercise_checks, narrowed
from grader.judge.verdicts import judge_exercise, not_checked
from grader.load.reference import available, reference
from grader.load.submission import Submission, find_submission, unfit_by_notebook
from grader.manifest import Exercise, load_manifest
from grader.sandbox.collected import Collected, Phases
from grader.sandbox.retiming import time_against_the_reference
from grader.sandbox.scheduler import AtOnce, in_threads
from grader.sandbox.starting import children_fence, stop_all_children
from grader.sandbox.supervisor import run_isolated
from labtext import _

__all__ = [
    "AtOnce",
    "DEVICES",
    "GradeOptions",
    "Limits",
    "Phases",
    "grade_path",
    "grade_submission",
    "stop_all_children",
]


def submission_seed(sub_id: str, seed: int) -> int:
    """Return the seed of a submission's random inputs, from its id and the run's seed."""
    return int.from_bytes(hashlib.sha256(f"{sub_id}:{seed}".encode()).digest()[:6], "big")


def default_threads(jobs: int = 1) -> int:
    """Return how many CPU threads each child uses: one, whatever `jobs` is. The checks'
    tensors are small, so more threads mostly wait for each other: on 2 idle cores a complete
    submission took 5.4 s with one thread and 5.4 s with two, and with one core kept busy by
    another process, 5.6 s with one and 58 s with two (their spinning waits got in the way).
    More cores are used by grading more submissions at a time (--jobs)."""
    return 1


def notebooks_at_once(jobs: int = 1) -> int:
    """Return how many notebooks of one submission are graded side by side: the cores left
    to each of the `jobs` submissions graded at a time (one child per notebook, one thread
    each). A submission's notebooks are independent: each has children of its own."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, jobs))


def load_for_judging(sub: Submission, references: bool = True) -> None:
    """Import, in the background, the checks of `sub`'s exercises (and with `references`,
    the hidden ones), decode the embedded sample, which judges measure trained models on, and
    load the reference solutions that judging `sub` will need (with `references`): while the
    fork server imports, and the children start and run, this process has nothing else to
    do."""

    def load() -> None:
        import dplab.data

        for ex in sub.exercises:  # their modules imported while the fork server imports
            try:
                exercise_checks(ex, include_hidden=references)
            except Exception:
                pass  # grading asks again, and reports what is wrong
        try:
            dplab.data.embedded_sample()
        except Exception:
            pass  # a judge that needs it meets the same error, and reports it
        for notebook in dict.fromkeys(ex.notebook for ex in sub.exercises if references):
            if available(notebook):
                try:
                    reference(notebook)
                except Exception:
                    pass  # judging loads it again, and reports what is wrong

    threading.Thread(target=load, daemon=True).start()


@dataclass(frozen=True)
class GradeOptions:
    """Every setting one grade takes, carried whole from the front end through the pipeline."""

    seed: int = 0
    hidden: bool = True  # the instructor's side: hidden checks, and timing against the reference
    limits: Limits = field(default_factory=Limits)
    threads: int | None = None  # of each child (None: default_threads())
    phases: Phases | None = None  # where the time each phase took is added
    # Keep the checks of these names (and those they come after), and run only their cases.
    only_checks: frozenset[str] | None = None
    # Notebooks graded at once: a number, or what a class run keeps up to date (None: the
    # cores).
    at_once: int | AtOnce | None = None
    # Keep only the notes about these exercises' cells (a student's check of one exercise).
    notes_about: tuple[Exercise, ...] | None = None

    def fingerprinted(self) -> dict:
        """Return the settings a result depends on, as a class's report records them."""
        return {"seed": self.seed, "hidden": self.hidden, "limits": repr(self.limits)}


def grade_submission(sub: Submission, options: GradeOptions = GradeOptions()) -> SubmissionResult:
    """Grade one submission end to end, as `options` say, and return its result. Its messages
    are in the submission's language (`sub.language`)."""
    with labtext.speaking(sub.language):
        results, notes = _graded(sub, options)
    if options.notes_about is not None:
        about = options.notes_about
        notes = [n for n in notes if any(n.about(ex.id, ex.function) for ex in about)]
    result = submission_result(sub.id, str(sub.path), results, notes)
    return dataclasses.replace(result, language=sub.language)


def _graded(sub: Submission, options: GradeOptions) -> tuple[list[ExerciseResult], list[Note]]:
    """Return the exercises' results, and the notes of the submission and its notebooks."""
    sub_seed = submission_seed(sub.id, options.seed)
    limits, hidden, phases = options.limits, options.hidden, options.phases
    threads = options.threads or default_threads()
    checks = {
        ex.id: narrowed(exercise_checks(ex, include_hidden=hidden), options.only_checks)
        for ex in sub.exercises
    }
    # A file that is not a notebook, or not the lab's, is said once per exercise, not
    # repeated by each of its checks, and its exercises run nothing.
    unfit = unfit_by_notebook(sub, load_manifest())
    problems = {ex.id: unfit[sub.notebooks[ex.notebook]] for ex in sub.exercises if
                sub.notebooks.get(ex.notebook) in unfit}  # fmt: skip
    fit = dataclasses.replace(sub, exercises=[e for e in sub.exercises if e.id not in problems])
    load_for_judging(fit, references=hidden)  # what the judging needs, while the children run
    at_once = options.at_once or notebooks_at_once()
    at_once = at_once if isinstance(at_once, AtOnce) else AtOnce(at_once)
    fit_checks = {ex.id: checks[ex.id] for ex in fit.exercises}
    lent = pace.chosen()
    collected = run_isolated(fit, fit_checks, sub_seed, limits, threads, phases, at_once, lent)
    judging = time.monotonic()
    if hidden:  # the instructor's side, where the reference solutions are
        time_against_the_reference(fit, fit_checks, collected, sub_seed, limits, threads, lent)
    results = [
        not_checked(ex.id, checks[ex.id], problems[ex.id])
        if ex.id in problems
        else judge_reported(ex, checks[ex.id], fit, collected, sub_seed, hidden)
        for ex in sub.exercises
    ]
    collected.phases.add("judging", time.monotonic() - judging)
    notes = [Note("submission", note) for note in sub.notes]
    for name in sorted(set(collected.notes) | set(collected.skip_notes)):
        items = collected.skip_notes.get(name, []) + collected.notes.get(name, [])
        notes += [dataclasses.replace(item, notebook=name) for item in items]
    return results, notes


def judge_reported(
    ex: Exercise,
    checks: list[Check],
    sub: Submission,
    collected: Collected,
    seed: int,
    hidden: bool,
) -> ExerciseResult:
    """Judge one exercise of a submission from what its children reported."""
    outcomes = dict(collected.outcomes.get(ex.id, {}))
    missing = ""
    if ex.notebook not in sub.notebooks:
        missing = _("{notebook} is missing from the submission").format(notebook=ex.notebook)
    elif ex.id in collected.stopped:
        missing = _(collected.stopped[ex.id])
    elif collected.changed.get(ex.id):
        names = ", ".join(collected.changed[ex.id][:4])
        outcomes = {}
        missing = _(
            "the submission changed the grader's own code or torch ({names}), so "
            "this exercise's results cannot be trusted"
        ).format(names=names)
    elif ex.id not in collected.outcomes:
        missing = _("{notebook} could not be loaded: {notes}").format(
            notebook=ex.notebook,
            notes="; ".join(n.text for n in collected.notes.get(ex.notebook, [])),
        )
    ctx = Context(seed, grading_devices(DEVICES), reference(ex.notebook) if hidden else None)
    return judge_exercise(ex.id, ex.function, checks, outcomes, ctx, diagnoser(ex), missing=missing)


def select_exercises(sub: Submission, exercises: list[str] | None) -> Submission:
    """Keep only the given exercise ids (all when None)."""
    if exercises:
        manifest = load_manifest()
        sub.exercises = [manifest.exercise(e) for e in exercises]
    return sub


def grade_path(path: str | Path, exercises: list[str] | None = None, **options) -> SubmissionResult:
    """Find the submission at `path`, keep only `exercises` (ids) if given, and grade it with
    the GradeOptions that `options` name."""
    sub = select_exercises(find_submission(path, load_manifest()), exercises)
    return grade_submission(sub, GradeOptions(**options))


def sandbox_said() -> str:
    """Say how the children are fenced: the fork server's fence where the fast path lends
    one, else this process's (grader.sandbox.fence)."""
    return children_fence(pace.chosen().fork_server()).described()


def class_side_by_side(fn: Callable, items: list, jobs: int):
    """Run `fn` on each item in threads, `jobs` at a time, and one more while the cores sit
    idle where the fast path says so (up to twice `jobs`); yield each call's future as it
    finishes, with how many still run (grader.sandbox.scheduler.in_threads)."""
    return in_threads(fn, items, pace.chosen().room(AtOnce(jobs), 2 * jobs), 2 * jobs)
