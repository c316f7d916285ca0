"""A class graded on a real one-node Slurm cluster (tests/slurm_cluster.py) by
docs/slurm/grade-class.sh: a job array of two slices (`grade --shard I/2`) and a merge job that
waits for both. The merged report equals a grade of the whole class on this machine, check by
check, and the gradebook and Gradescope's folders hold every student. Needs root and
`apt install slurm-wlm munge`; a bad call of the script is refused everywhere."""

import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from grader.benchmarks.grade import make_class
from tests.conftest import python
from tests.slurm_cluster import ENDED, SLURM_GRACE, cluster_missing, one_node_cluster
from tests.test_shards import checks

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "slurm" / "grade-class.sh"
ONLY = ["-e", "allreduce", "-e", "split_batch", "-e", "train_batch"]
STUDENTS = ["student01", "student02", "student03", "student04"]
USAGE = "usage: docs/slurm/grade-class.sh SUBMITTED N [OUT]"
TIME_LIMIT = 300  # seconds: each job's --time


def script(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=60)  # fmt: skip


def when(record: dict[str, str], field: str) -> datetime:
    return datetime.fromisoformat(record[field])


@pytest.fixture(scope="module")
def slurm():
    if why := cluster_missing():
        pytest.skip(why)
    with one_node_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def graded(slurm):
    """The class of 4 graded whole here, and by the script in 2 slices and a merge on Slurm:
    the folder, what the script printed, the jobs' ids, the merge job as squeue listed it just
    after submission, and `scontrol show job` of both once they had ended."""
    root = Path(tempfile.mkdtemp(prefix="lab-slurm-grading-"))
    ids: list[str] = []
    try:
        make_class(root / "submitted", len(STUDENTS))
        whole = subprocess.run(
            [python(), "-m", "grader", "grade", str(root / "submitted"), "--json",
             str(root / "whole.json"), "--jobs", "2", *ONLY],
            capture_output=True, text=True, cwd=REPO, timeout=300,
        )  # fmt: skip
        assert whole.returncode == 0, whole.stdout + whole.stderr
        env = dict(slurm.env, PYTHON=python(), PARTITION=slurm.partition, CPUS_PER_TASK="1",
                   MEM="1G", TIME_LIMIT=f"{TIME_LIMIT // 60}:00", MERGE_MEM="512M",
                   GRADE_ARGS=" ".join(ONLY))  # fmt: skip
        submitted = script(str(root / "submitted"), "2", str(root / "out"), env=env)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        said = dict(line.split(": ", 1) for line in submitted.stdout.splitlines())
        array, merge = (said[key].split()[0] for key in ("grading job array", "merge job"))
        ids += [array, merge]
        waiting = slurm.run("squeue", "-h", "-j", merge, "-o", "%T|%r|%E").strip()
        # Slurm ends each job at its time limit (state TIMEOUT, which fails the tests below);
        # this wait, for the array and then the merge, only guards against a silent cluster.
        deadline = time.monotonic() + 2 * TIME_LIMIT + SLURM_GRACE
        while True:
            records = slurm.job_records(array) + slurm.job_records(merge)
            if records and all(r.get("JobState") in ENDED for r in records):
                break
            assert time.monotonic() < deadline, (
                f"Slurm never ended the jobs: {records}\n{slurm.logs()}"
            )
            time.sleep(1)
        yield {
            "root": root,
            "printed": submitted.stdout,
            "array": array,
            "merge": merge,
            "waiting": waiting,
            "tasks": slurm.job_records(array),
            "merged": slurm.job_records(merge),
        }
    finally:
        for job in ids:
            slurm.run("scancel", job, check=False)
        shutil.rmtree(root, ignore_errors=True)


def logs(graded) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                     for p in sorted((graded["root"] / "out").glob("*.log")))  # fmt: skip


def test_the_script_says_where_the_jobs_and_results_are(graded):
    out = graded["root"] / "out"
    printed = graded["printed"]
    assert f"grading job array: {graded['array']} (2 tasks;" in printed
    assert f"merge job: {graded['merge']} (starts when every task has succeeded;" in printed
    assert f"results: {out}/results.json, {out}/grades.csv, {out}/gradescope/" in printed


def test_the_array_had_two_tasks_that_completed(graded):
    tasks = sorted(graded["tasks"], key=lambda r: r.get("ArrayTaskId", ""))
    assert [(r.get("ArrayJobId"), r.get("ArrayTaskId"), r["JobState"], r["ExitCode"])
            for r in tasks] == [(graded["array"], str(i), "COMPLETED", "0:0")
                                for i in range(2)], logs(graded)  # fmt: skip
    out = graded["root"] / "out"
    for i in range(2):  # each task graded its slice, as many at a time as it had CPUs
        log = (out / f"slice-{i}.log").read_text()
        assert "submission(s), 1 at a time;" in log and "(2/2 graded," in log, log
        assert (out / f"slice-{i}.json").exists()


def test_the_merge_job_waited_for_the_array_and_ran_after_it(graded):
    state, reason, dependency = graded["waiting"].split("|")
    assert (state, reason) == ("PENDING", "Dependency"), graded["waiting"]
    assert dependency.startswith(f"afterok:{graded['array']}"), dependency
    [merge] = graded["merged"]
    assert (merge["JobState"], merge["ExitCode"]) == ("COMPLETED", "0:0"), logs(graded)
    assert when(merge, "StartTime") >= max(when(t, "EndTime") for t in graded["tasks"])
    assert "2 slices joined: 4 submissions" in (graded["root"] / "out" / "merge.log").read_text()


def test_the_merged_report_equals_a_grade_of_the_whole_class_check_by_check(graded):
    merged = checks(graded["root"] / "out" / "results.json")
    whole = checks(graded["root"] / "whole.json")
    assert list(merged) == list(whole) == STUDENTS  # the class's order
    assert merged == whole
    assert {len(c) for c in whole.values()} != {0}  # the exercises were graded, not skipped


def test_the_gradebook_and_gradescope_hold_every_student(graded):
    out = graded["root"] / "out"
    rows = (out / "grades.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == STUDENTS
    assert sorted(p.name for p in (out / "gradescope").iterdir()) == STUDENTS
    assert all((out / "gradescope" / s / "results.json").exists() for s in STUDENTS)


@pytest.mark.parametrize(
    "args, said",
    [
        ([], "give SUBMITTED and N"),
        (["{tmp}/submitted", "0", "{tmp}/out"], "N must be a whole number, 1 or more, not '0'"),
        (["{tmp}/submitted", "two", "{tmp}/out"], "N must be a whole number, 1 or more, not 'two'"),
        (["{tmp}/nowhere", "2", "{tmp}/out"], "/nowhere is not a folder"),
    ],
)
def test_a_bad_call_is_refused_with_the_usage(args, said, tmp_path):
    (tmp_path / "submitted").mkdir()
    refused = script(*(a.format(tmp=tmp_path) for a in args))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert said in refused.stderr and USAGE in refused.stderr, refused.stderr
    assert refused.stdout == "" and not (tmp_path / "out").exists()
