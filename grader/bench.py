"""`make bench-grade`: time the grader, on one complete submission and on a generated class.

    python -m grader.bench [--students 20] [--jobs 2] [--keep DIR]

First one complete submission (the reference solutions in the released notebooks) is graded
on its own; then a class that mixes reference solutions, untouched stubs and submissions with
catalogued mistakes, side by side. Timings live here, never in the tests: a test that asserts
a wall-clock time fails whenever the machine is busy.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from grader.authoring import filled_in, reference_answers
from grader.batch import Outputs, expand, grade_class
from grader.exports import summary_table
from grader.manifest import exercises_dir, load_manifest
from grader.mistakes import mistakes_of

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


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m grader.bench", description=__doc__)
    p.add_argument("--students", type=int, default=20, help="class size (default: %(default)s)")
    p.add_argument(
        "--jobs", type=int, default=2, help="submissions at a time (default: %(default)s)"
    )
    p.add_argument("--keep", type=Path, help="write the class and the report here, and keep them")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        make_class(root / "alone", 1)  # one complete submission, graded on its own first
        (alone,) = grade_class(
            expand([root / "alone"], load_manifest()),
            Outputs(json=root / "alone.json"),
            jobs=1,
            regrade=True,
            progress=lambda *a: None,
        )
        make_class(root / "submitted", args.students)
        subs = expand([root / "submitted"], load_manifest())
        started = time.monotonic()
        results = grade_class(
            subs,
            Outputs(json=root / "results.json"),
            jobs=args.jobs,
            regrade=True,
            progress=lambda *a: None,
        )
        seconds = time.monotonic() - started
    print(summary_table(results, load_manifest()))
    print(
        f"\none complete submission (the reference solutions) graded alone: "
        f"{alone.seconds:.1f} s, {alone.score:g}/{alone.max_score:g}"
    )
    print(
        f"\n{len(results)} submissions graded with --jobs {args.jobs} in {seconds:.1f} s: "
        f"{seconds / len(results):.1f} s per submission"
    )
    for kind in KINDS:
        times = [r.seconds for r in results if kind_of(int(r.id[len("student") :]) - 1) == kind]
        if times:
            print(
                f"  {kind}: {len(times)} submissions, {sum(times) / len(times):.1f} s each "
                f"on average, {max(times):.1f} s at most"
            )


if __name__ == "__main__":
    main()
