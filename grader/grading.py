"""Grade a submission: find its notebooks, run its cases in a child process, judge, report.

    find_submission -> run_isolated -> judge_submission -> SubmissionResult

The child process is the only place where student code runs; this process reads the plain
data it leaves behind and decides every verdict.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

from dplab.devices import lab_devices
from grader.api import Context
from grader.judge import judge_exercise
from grader.loader import load_notebook
from grader.manifest import Exercise, load_manifest, solutions_dir
from grader.registry import diagnoser, exercise_checks
from grader.report import ExerciseResult, SubmissionResult, exercise_result, submission_result
from grader.submission import Submission, find_submission

DEFAULT_TIMEOUT = 600.0
DEVICES = 2  # the exercises train on two devices, like the book


def submission_seed(sub_id: str, seed: int) -> int:
    """Return the seed of a submission's random inputs, from its id and the run's seed."""
    return int.from_bytes(hashlib.sha256(f"{sub_id}:{seed}".encode()).digest()[:6], "big")


@cache
def reference(notebook: str) -> dict:
    """Return the names defined by the reference solution of `notebook` (instructor side)."""
    path = solutions_dir() / notebook
    if not path.is_file():
        raise FileNotFoundError(f"the reference solution {path} is missing; hidden checks need it")
    return load_notebook(
        path, load_manifest().training_functions, module_name=f"reference_{Path(notebook).stem}"
    ).namespace


def child_environment(scratch: Path) -> dict[str, str]:
    """Return the environment of the grading child: headless, offline, plots into scratch."""
    env = dict(os.environ)
    env.update(
        MPLBACKEND="Agg",
        DPLAB_OFFLINE="1",
        DPLAB_FIGURE_DIR=str(scratch),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def run_isolated(sub: Submission, seed: int, hidden: bool, timeout: float, scratch: Path) -> str:
    """Run the submission's cases in a child process; return "" or why it stopped early."""
    request = {
        "notebooks": {name: str(path.resolve()) for name, path in sub.notebooks.items()},
        "exercises": [ex.id for ex in sub.exercises],
        "seed": seed,
        "hidden": hidden,
        "devices": DEVICES,
        "out": str(scratch),
    }
    (scratch / "request.json").write_text(json.dumps(request))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "grader.child", str(scratch / "request.json")],
            cwd=scratch,
            env=child_environment(scratch),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"grading stopped at the time limit of {timeout:g} s while running these checks"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1][:300]
        return f"the grading process ended with exit code {proc.returncode} ({last})"
    return ""


def read_outcomes(scratch: Path, exercise_id: str) -> dict | None:
    """Return the outcomes the child wrote for an exercise, or None if it wrote none."""
    path = scratch / f"{exercise_id}.pt"
    if not path.is_file():
        return None
    data = torch.load(path, weights_only=True)
    return data if isinstance(data, dict) else None


def judge_one(
    ex: Exercise,
    outcomes: dict | None,
    sub: Submission,
    seed: int,
    hidden: bool,
    stopped: str,
    notes: list[str],
) -> ExerciseResult:
    """Judge one exercise of a submission from the child's outcomes."""
    checks = exercise_checks(ex, include_hidden=hidden)
    if ex.notebook not in sub.notebooks:
        missing = f"{ex.notebook} is missing from the submission"
    elif outcomes is None:
        missing = stopped or f"{ex.notebook} could not be loaded: " + "; ".join(notes)
    else:
        missing = ""
    ctx = Context(seed, lab_devices(DEVICES), reference(ex.notebook) if hidden else None)
    return judge_exercise(
        ex.id, ex.function, checks, outcomes or {}, ctx, diagnoser(ex), missing=missing
    )


def grade_submission(
    sub: Submission, seed: int = 0, hidden: bool = True, timeout: float = DEFAULT_TIMEOUT
) -> SubmissionResult:
    """Grade one submission end to end and return its result."""
    sub_seed = submission_seed(sub.id, seed)
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        scratch = Path(tmp)
        stopped = run_isolated(sub, sub_seed, hidden, timeout, scratch) if sub.notebooks else ""
        load_notes = {}
        if (scratch / "notes.json").is_file():
            load_notes = json.loads((scratch / "notes.json").read_text())
        results = []
        for ex in sub.exercises:
            notes = load_notes.get(ex.notebook, [])
            results.append(
                judge_one(ex, read_outcomes(scratch, ex.id), sub, sub_seed, hidden, stopped, notes)
            )
    notes = list(sub.notes)
    for name, items in load_notes.items():
        notes += [f"{name}: {item}" for item in items]
    return submission_result(sub.id, str(sub.path), results, notes)


def grade_path(path: str | Path, exercises: list[str] | None = None, **options) -> SubmissionResult:
    """Find the submission at `path`, keep only `exercises` (ids) if given, and grade it."""
    manifest = load_manifest()
    sub = find_submission(path, manifest)
    if exercises:
        wanted = [manifest.exercise(e).id for e in exercises]
        sub.exercises = [ex for ex in sub.exercises if ex.id in wanted]
        for missing in set(wanted) - {ex.id for ex in sub.exercises}:
            sub.exercises.append(manifest.exercise(missing))
    return grade_submission(sub, **options)


__all__ = ["exercise_result", "grade_path", "grade_submission"]
