"""torchrun across Slurm tasks: docs/slurm/train-ddp.sbatch on a real one-node Slurm cluster
(tests/slurm_cluster.py), as a job of two tasks, each a torchrun agent of one process
(`--nnodes 2`, c10d rendezvous on the job's first host). The reference notebook's train_ddp
trains on a little of the sample over gloo, and rank 0 prints its summary once. Needs root and
`apt install slurm-wlm munge`."""

import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import python
from tests.slurm_cluster import ENDED, SLURM_GRACE, cluster_missing, one_node_cluster

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "slurm" / "train-ddp.sbatch"
NOTEBOOK = "solutions/multigpu/distributed.ipynb"
TIME_LIMIT = 300  # seconds: the job's --time
SUMMARY = re.compile(r"^[01]: test acc: \d\.\d\d, [\d.]+ sec/epoch on 2 processes \(gloo, cpu\)$")


@pytest.fixture(scope="module")
def trained():
    """The job's record once it has ended, and its log."""
    if why := cluster_missing():
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="lab-slurm-torchrun-"))
    root.chmod(0o755)
    log = root / "train-ddp.log"
    job = ""
    try:
        with one_node_cluster() as slurm:
            env = dict(slurm.env, PYTHON=python(), NOTEBOOK=NOTEBOOK, NPROC="1",
                       TRAIN_ARGS="--epochs 1 --batch-size 64 --lr 0.3",
                       DPLAB_DATA_SOURCE="sample", DPLAB_DATA_LIMIT="256,128", DPLAB_OFFLINE="1",
                       GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                       DPLAB_FIGURE_DIR=str(root))  # fmt: skip
            # One node here: both tasks on it. The options on sbatch's command line override
            # the script's #SBATCH lines (--nodes=2 --ntasks-per-node=1 --cpus-per-task=8).
            slurm.env = env
            job = slurm.run(
                "sbatch", "--parsable", f"--chdir={REPO}", f"--partition={slurm.partition}",
                "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1",
                "--mem=4G", f"--time={TIME_LIMIT // 60}:00", f"--output={log}", str(SCRIPT),
            ).strip().split(";")[0]  # fmt: skip
            # Slurm itself ends the job at its time limit (state TIMEOUT, which fails the tests
            # below); this wait only guards against a cluster that stopped answering.
            deadline = time.monotonic() + TIME_LIMIT + SLURM_GRACE
            while True:
                records = slurm.job_records(job)
                if records and all(r.get("JobState") in ENDED for r in records):
                    break
                text = log.read_text() if log.exists() else ""
                assert time.monotonic() < deadline, f"Slurm never ended the job: {records}\n{text}"
                time.sleep(1)
            yield {"job": job, "record": records[0], "log": log.read_text()}
            slurm.run("scancel", job, check=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_job_completed(trained):
    record = trained["record"]
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), trained["log"]
    assert (record["NumNodes"], record["NumTasks"]) == ("1", "2")


def test_each_task_was_a_torchrun_agent_of_a_group_of_two(trained):
    log = trained["log"]
    said = [line for line in log.splitlines() if line.startswith("train-ddp: ")]
    assert (
        len(said) == 1 and "2 torchrun agents (2 tasks on 1 nodes), 1 process(es) each" in (said[0])
    ), log
    agents = sorted(re.findall(r"^(\d): torchrun agent of task (\d)/2 on ", log, re.M))
    assert agents == [("0", "0"), ("1", "1")], log


def test_rank_0_prints_the_summary_once_for_two_processes(trained):
    log = trained["log"]
    summaries = [line for line in log.splitlines() if "test acc: " in line]
    assert len(summaries) == 1 and SUMMARY.match(summaries[0]), log


def test_the_ranks_train_on_the_data_the_job_asked_for(trained):
    """DPLAB_DATA_SOURCE=sample reaches train_ddp's data: no rank reads the full set, even
    where the dataset-fashion-mnist package is installed."""
    log = trained["log"]
    loaded = [line for line in log.splitlines() if re.match(r"^[01]: Fashion-MNIST: ", line)]
    assert loaded and not [line for line in loaded if "60,000" in line], log
