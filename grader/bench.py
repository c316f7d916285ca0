"""`make bench-grade`: grade a generated class of submissions side by side, and time it.

    python -m grader.bench [--students 20] [--jobs 2] [--keep DIR]

The class mixes reference solutions, untouched stubs and submissions with catalogued
mistakes, in the released notebooks as students would hand them in.
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


def make_class(folder: Path, students: int) -> None:
    """Write `students` submissions under folder/<student>/<assignment>/."""
    manifest = load_manifest()
    catalogue = [(ex, m) for ex in manifest.exercises for m in mistakes_of(ex).values()]
    for i in range(students):
        target = folder / f"student{i + 1:02d}" / manifest.assignment
        target.mkdir(parents=True)
        for notebook in manifest.notebooks:
            answers = {} if i % 4 == 1 else reference_answers(notebook)
            if i % 4 >= 2:  # two catalogued mistakes each, different ones per student
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
    slowest = max(r.seconds for r in results)
    print(
        f"\n{len(results)} submissions graded with --jobs {args.jobs} in {seconds:.1f} s: "
        f"{seconds / len(results):.1f} s per submission "
        f"(one submission alone took at most {slowest:.1f} s)"
    )


if __name__ == "__main__":
    main()
