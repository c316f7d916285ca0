"""`make bench-grade`: time the grader, on one complete submission and on a generated class.

    python -m grader.benchmarks.grade [--students 20] [--jobs 2] [--keep DIR]

First one complete submission (the reference solutions in the released notebooks) is graded
by `python -m grader grade`, as an instructor would, twice: the first command starts the warm
fork server (in a folder of the bench's own, so none is there before), the second finds it
warm. Then one exercise is checked by `python -m grader check`, as a student would, and the
newest notebook is graded alone, cold and warm (what it adds to a grade). Each is
timed from the command to its report. Before them, an untimed Python imports what the server
imports, so that PyTorch's files are in the page cache, as on a machine where the lab is in
use (after a fresh clone's `make test` had installed PyTorch again, the first cold grade read
them from the disk: 7.1 s instead of 6.0 to 6.2 s).
Then a class that mixes reference solutions, untouched stubs and submissions with
catalogued mistakes is graded side by side, with the time of each phase. Timings live here,
never in the tests: a test that asserts a wall-clock time fails whenever the machine is busy.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader import pace, settings
from grader.base.results import SubmissionResult
from grader.class_grading import ClassOptions, Outputs, expand, grade_class
from grader.exercises.catalogue import mistakes_of
from grader.grading import GradeOptions
from grader.judge.registry import exercise_points
from grader.manifest import REPO, Manifest, exercises_dir, load_manifest
from grader.report.exports import summary_table
from grader.sandbox.collected import Phases
from grader.sandbox.fast.forkserver import stop
from grader.sandbox.fast.warm_client import stop_warm
from grader.tools.authoring import filled_in, reference_answers

KINDS = ("reference solutions", "untouched stubs", "catalogued mistakes")


def kind_of(index: int) -> str:
    """Return what submission number `index` (from 0) holds."""
    return KINDS[min(index % 4, 2)]


def make_class(folder: Path, students: int) -> None:
    """Write `students` submissions under folder/<student>/<assignment>/: one in four holds
    the reference solutions, one the untouched stubs, two catalogued mistakes."""
    manifest = load_manifest()
    catalogue = [(ex, m) for ex in manifest.exercises for m in mistakes_of(ex).values()]
    for i in range(students):
        target = folder / f"student{i + 1:02d}" / manifest.assignment
        target.mkdir(parents=True)
        for notebook in manifest.notebooks:
            kind = kind_of(i)
            answers = {} if kind == KINDS[1] else reference_answers(notebook)
            if kind == KINDS[2]:  # two catalogued mistakes each, different ones per student
                for ex, m in (
                    catalogue[(2 * i) % len(catalogue)],
                    catalogue[(2 * i + 1) % len(catalogue)],
                ):
                    if ex.notebook == notebook:
                        answers[f"{ex.id}-solution"] = m.source
            nb = filled_in(exercises_dir() / notebook, answers)
            (target / notebook).write_text(json.dumps(nb), encoding="utf-8")


def wall_seconds(*command: str) -> tuple[float, str]:
    """Run `python -m grader COMMAND...` as a user would; return its seconds and its output."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "grader", *command], capture_output=True, text=True, cwd=REPO
    )
    return time.monotonic() - started, done.stdout


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m grader.benchmarks.grade", description=__doc__)
    p.add_argument("--students", type=int, default=20, help="class size (default: %(default)s)")
    p.add_argument(
        "--jobs", type=int, default=2, help="submissions at a time (default: %(default)s)"
    )
    p.add_argument("--keep", type=Path, help="write the class and the report here, and keep them")
    return p.parse_args()


def warm_page_cache() -> None:
    """Import what the warm server imports, untimed: PyTorch's files into the page cache
    (see the module docstring)."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch.distributed.tensor, torch._dynamo, matplotlib.pyplot",
        ],
        cwd=REPO,
        capture_output=True,
    )


def time_commands(alone: Path, manifest: Manifest) -> None:
    """Time `python -m grader grade` on the complete submission `alone`, as the command that
    starts the warm server and then with the server warm, and a student's `check`."""
    full = sum(exercise_points(ex) for ex in manifest.exercises)
    for when in ("it starts the warm server", "the server is warm"):
        # A later command: once a command has ended, the server imports what it still
        # lacks (0.2 to 0.45 s at a time): a command that comes at once waits for that.
        time.sleep(0 if when.startswith("it") else 2)
        seconds, out = wall_seconds("grade", str(alone))
        totals = [line.split()[1] for line in out.splitlines() if line.startswith("total")]
        print(
            f"one complete submission (the reference solutions), `python -m grader grade`, "
            f"{when}: {seconds:.1f} s from the command to its report, "
            f"{totals[0] if totals else '?'}/{full:g}"
        )
    notebook = alone / manifest.exercise("allreduce").notebook
    time.sleep(2)
    seconds, _ = wall_seconds("check", str(notebook), "--exercise", "allreduce")
    print(f"a student's `python -m grader check NOTEBOOK --exercise allreduce`: {seconds:.1f} s")


def time_newest_notebook(alone: Path, manifest: Manifest, warm_folder: Path) -> None:
    """Time `python -m grader grade` on the manifest's last notebook alone (what adding it
    costs a grade), with a warm server of its own: the command that starts it, then warm;
    then give the bench's `warm_folder` back to the commands after."""
    notebook = manifest.notebooks[-1]
    full = sum(exercise_points(ex) for ex in manifest.in_notebook(notebook))
    folder = Path(tempfile.mkdtemp(prefix="grader-warm-bench-alone-"))
    os.environ[settings.WARM_DIR.name] = str(folder)
    try:
        for when in ("it starts the warm server", "the server is warm"):
            time.sleep(0 if when.startswith("it") else 2)
            seconds, out = wall_seconds("grade", str(alone / notebook))
            totals = [line.split()[1] for line in out.splitlines() if line.startswith("total")]
            print(
                f"{notebook} alone, `python -m grader grade`, {when}: {seconds:.1f} s, "
                f"{totals[0] if totals else '?'}/{full:g}"
            )
    finally:
        stop_warm(folder)
        os.environ[settings.WARM_DIR.name] = str(warm_folder)
        for made in (folder, folder.with_name(f"{folder.name}-cache")):
            shutil.rmtree(made, ignore_errors=True)


def time_class(
    root: Path, students: int, jobs: int, manifest: Manifest, phases: Phases
) -> tuple[list[SubmissionResult], float]:
    """Grade a generated class of `students` under root/submitted/, `jobs` at a time, into
    root/results.json; return the results and the seconds it took."""
    make_class(root / "submitted", students)
    subs = expand([root / "submitted"], manifest)
    pace.chosen().fork_server()  # started once per run, as `grade` does
    started = time.monotonic()
    options = ClassOptions(GradeOptions(phases=phases), jobs=jobs, regrade=True)
    results = grade_class(subs, Outputs(json=root / "results.json"), options, lambda *a: None)
    return results, time.monotonic() - started


def report(
    results: list[SubmissionResult], seconds: float, jobs: int, phases: Phases, manifest: Manifest
) -> None:
    """Print the class's summary, its time by kind of submission and by phase."""
    print(
        summary_table(results, manifest, {ex.id: exercise_points(ex) for ex in manifest.exercises})
    )
    print(
        f"\n{len(results)} submissions graded with --jobs {jobs} in {seconds:.1f} s: "
        f"{seconds / len(results):.1f} s per submission"
    )
    for kind in KINDS:
        times = [r.seconds for r in results if kind_of(int(r.id[len("student") :]) - 1) == kind]
        if times:
            print(
                f"  {kind}: {len(times)} submissions, {sum(times) / len(times):.1f} s each "
                f"on average, {max(times):.1f} s at most"
            )
    print("per submission, by phase (seconds of wall time, side by side with the others):")
    for name, spent in phases.seconds.items():
        print(f"  {name:<14}{spent / len(results):6.2f}")


def main() -> None:
    args = arguments()
    manifest = load_manifest()
    started_by = "fork" if pace.chosen().fork_server() is not None else "spawn"
    print(f"{os.cpu_count()} cores, children started by {started_by}")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        warm_folder = Path(tempfile.mkdtemp(prefix="grader-warm-bench-"))
        os.environ[settings.WARM_DIR.name] = str(warm_folder)
        make_class(root / "alone", 1)  # one complete submission
        warm_page_cache()
        time_commands(root / "alone" / "student01" / manifest.assignment, manifest)
        time_newest_notebook(
            root / "alone" / "student01" / manifest.assignment, manifest, warm_folder
        )
        phases = Phases()
        results, seconds = time_class(root, args.students, args.jobs, manifest, phases)
        stop()
        stop_warm(warm_folder)
        for made in (warm_folder, warm_folder.with_name(f"{warm_folder.name}-cache")):
            shutil.rmtree(made, ignore_errors=True)
    report(results, seconds, args.jobs, phases, manifest)


if __name__ == "__main__":
    main()
