"""Time a class graded in N slices on Slurm against one `grade --jobs J` on this machine.

    python -m tests.bench_shards [--students 20] [--jobs 2] [--shards 1 2 4]

A class of `--students` (grader.benchmarks.grade.make_class: reference solutions, untouched stubs and
catalogued mistakes) is graded once by `python -m grader grade CLASS --jobs J --json ...`,
timed from the command to its end. Then a one-node Slurm cluster starts here
(tests/slurm_cluster.py: needs root and `apt install slurm-wlm munge`), and for each N
docs/slurm/grade-class.sh grades the same class in N slices and merges them, timed from the
script's call (the submission) to the end of the merge job. The total work is the same each
time; a slice's task has one CPU, or all of the node's when N is 1 (CPUS_PER_TASK), and grades
that many submissions at a time. Every report must hold every student.

No grader outlives its command here (GRADER_WARM_SECONDS=0, in a warm folder of the bench's
own), so that each grade, here or in a job, starts as cold as the first. Timings live here, not
in the tests: a test that asserts a wall-clock time fails whenever the machine is busy.
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

from grader.benchmarks.grade import make_class
from tests.slurm_cluster import ENDED, cluster_missing, one_node_cluster

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "slurm" / "grade-class.sh"


def students_in(report: Path) -> list[str]:
    return [s["id"] for s in json.loads(report.read_text())["submissions"]]


def check_report(report: Path, expected: list[str], what: str) -> None:
    found = students_in(report) if report.exists() else []
    if sorted(found) != expected:
        raise SystemExit(f"{what}: {report} holds {len(found)} students, not {len(expected)}")


def grade_here(submitted: Path, report: Path, jobs: int) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "grader", "grade", str(submitted), "--jobs", str(jobs),
         "--json", str(report)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"grade --jobs {jobs} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def grade_on_slurm(slurm, submitted: Path, out: Path, shards: int, cpus: int) -> float:
    """Seconds from grade-class.sh's call to the end of its merge job."""
    env = dict(slurm.env, PYTHON=sys.executable, PARTITION=slurm.partition,
               CPUS_PER_TASK=str(cpus), MEM="4G", TIME_LIMIT="30:00", MERGE_MEM="1G")  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), str(submitted), str(shards), str(out)],
                          capture_output=True, text=True, cwd=REPO, env=env)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"grade-class.sh failed:\n{done.stdout}{done.stderr}")
    said = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    array, merge = (said[key].split()[0] for key in ("grading job array", "merge job"))
    while True:
        records = slurm.job_records(array) + slurm.job_records(merge)
        if records and all(r.get("JobState") in ENDED for r in records):
            seconds = time.monotonic() - started
            break
        if time.monotonic() - started > 1800:
            slurm.run("scancel", array, merge, check=False)
            raise SystemExit(f"N={shards}: not done in 30 minutes: {records}")
        time.sleep(0.5)
    failed = [r for r in records if (r["JobState"], r["ExitCode"]) != ("COMPLETED", "0:0")]
    if failed:
        logs = "\n".join(p.read_text()[-2000:] for p in sorted(out.glob("*.log")))
        raise SystemExit(f"N={shards}: jobs did not complete: {failed}\n{logs}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench_shards", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--students", type=int, default=20, help="class size (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=2, help="--jobs of the grade here (default: 2)")
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4], help="the Ns (1 2 4)")
    args = p.parse_args()
    if why := cluster_missing():
        raise SystemExit(f"no Slurm cluster here: {why}")
    cpus = os.cpu_count() or 1
    root = Path(tempfile.mkdtemp(prefix="lab-bench-shards-"))
    root.chmod(0o755)
    os.environ.update(GRADER_WARM_DIR=str(root / "warm"), GRADER_WARM_SECONDS="0")
    rows: list[tuple[str, float]] = []
    try:
        make_class(root / "submitted", args.students)
        expected = sorted(p.name for p in (root / "submitted").iterdir())
        subprocess.run(  # untimed: PyTorch's files into the page cache, as grader.benchmarks.grade does
            [sys.executable, "-c", "import torch.distributed.tensor, torch._dynamo, matplotlib"],
            cwd=REPO, capture_output=True,
        )  # fmt: skip
        print(f"{cpus} CPUs; a class of {args.students}", flush=True)
        seconds = grade_here(root / "submitted", root / "here.json", args.jobs)
        check_report(root / "here.json", expected, "grade here")
        rows.append((f"grade --jobs {args.jobs} here", seconds))
        print(f"  {rows[-1][0]}: {seconds:.1f} s", flush=True)
        with one_node_cluster() as slurm:
            for shards in args.shards:
                per_task = cpus if shards == 1 else 1
                out = root / f"out-{shards}"
                seconds = grade_on_slurm(slurm, root / "submitted", out, shards, per_task)
                check_report(out / "results.json", expected, f"N={shards}")
                rows.append((f"Slurm, N={shards} ({per_task} CPU(s) a task)", seconds))
                print(f"  {rows[-1][0]}: {seconds:.1f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    width = max(len(name) for name, _ in rows)
    print(f"\n{'a class of ' + str(args.students):<{width}}  seconds  vs here")
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds:7.1f}  {seconds / rows[0][1]:6.2f}x")
    print("(Slurm: from grade-class.sh's call to the merge job's end; every report holds every "
          "student)")  # fmt: skip


if __name__ == "__main__":
    main()
