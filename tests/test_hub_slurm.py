"""A class's hub on Slurm, for real: a one-node Slurm cluster (tests/slurm_cluster.py: munged,
slurmctld and slurmd on a configuration of their own, on free ports) and the hub started with
docs/hub/slurm_config.py. A student logs in and their lab runs as a batch job of their own
system account; stopping the lab through the hub ends the job.

The node has no GPU: /dev/null stands in for one in its gres.conf, so that the lab's
`--gres=gpu:1` is granted and Slurm hands the job a device, as it would on a GPU node. Needs
root (Slurm's daemons and the students' accounts) and `apt install slurm-wlm munge`."""

import secrets
import shutil
import time
from pathlib import Path

import pytest

from hub import running
from hub.lab_hub import remove_account
from tests.slurm_cluster import cluster_missing, one_node_cluster
from tests.test_hub import (
    A_RIGHT_TRY_GPU_CHECKED,
    NOTEBOOKS,
    closed_lab,
    lent_python,
)

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow
CONFIG = REPO / "docs" / "hub" / "slurm_config.py"
STUDENT = "ann"


class SlurmHub(running.Hub):
    """running.Hub started with docs/hub/slurm_config.py instead of hub/jupyterhub_config.py."""

    config = CONFIG


def lend_singleuser(python: str) -> None:
    """Give the students' Python the `jupyterhub-singleuser` that a virtual environment with
    the hub's packages has beside its Python (python_for_students makes one without scripts)."""
    script = Path(python).parent / "jupyterhub-singleuser"
    if not script.exists():
        script.write_text(
            f"#!{python}\nimport sys\n\nfrom jupyterhub.singleuser import main\n\nsys.exit(main())\n"
        )
        script.chmod(0o755)


@pytest.fixture(scope="module")
def slurm():
    if why := cluster_missing() or running.hub_lacks():
        pytest.skip(why)
    with one_node_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    homes = running.temporary_homes()
    left = ""  # the student's jobs still queued once the hub is gone
    try:
        python = lent_python(homes)
        lend_singleuser(python)
        prefix = f"t{secrets.token_hex(2)}-"
        folder = tmp_path_factory.mktemp("hub")
        hub = SlurmHub(
            folder, [STUDENT], lab=closed_lab(folder), HUB_HOMES=str(homes),
            HUB_USER_PREFIX=prefix, HUB_PYTHON=python, HUB_SLURM_PARTITION=slurm.partition,
            HUB_SLURM_GPUS="1", HUB_SLURM_CPUS="1", HUB_SLURM_MEM="1G", HUB_SLURM_TIME="10:00",
            HUB_SLURM_WAIT="90", SLURM_CONF=str(slurm.conf),
        )  # fmt: skip
        hub.account = prefix + STUDENT
        try:
            hub.start()
            yield hub
        finally:
            hub.stop()
            slurm.run("scancel", "-u", hub.account, check=False)
            deadline = time.monotonic() + 20
            while (left := slurm.run("squeue", "-h", "-u", hub.account, check=False)) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.3)
            remove_account(hub.account)
    finally:
        shutil.rmtree(homes, ignore_errors=True)
    # After the cleaning up, which must run all the same; reached only where nothing failed.
    assert not left, f"{hub.account}'s jobs were still queued 20 s after scancel:\n{left}"


@pytest.fixture(scope="module")
def lab(hub):
    """The student logged in, their lab started."""
    user = hub.login(STUDENT)
    user.start_lab()
    return user


def names_in(listing) -> set[str]:
    return {item["name"] for item in listing.json()["content"]}


def test_a_students_lab_is_a_slurm_job_of_their_own_account(slurm, hub, lab):
    jobs = slurm.jobs(hub.account)
    assert [(j["user"], j["name"], j["state"], j["node"]) for j in jobs] == [
        (hub.account, "spawner-jupyterhub", "RUNNING", slurm.node)
    ], slurm.logs()
    assert names_in(lab.lab_api("GET", "/contents/multigpu")) == NOTEBOOKS


def test_the_job_holds_what_the_hub_asks_for(slurm, hub, lab):
    [job] = slurm.jobs(hub.account)
    assert (job["cpus"], job["memory"], job["time_limit"]) == ("1", "1G", "10:00")
    assert "gpu:1" in job["gres"], job
    # The lab's kernels run inside that job, and see the GPU Slurm handed it.
    said = lab.run("import os\nprint(os.environ.get('SLURM_JOB_ID'), "
                   "os.environ.get('CUDA_VISIBLE_DEVICES'))")  # fmt: skip
    assert said.split() == [job["id"], "0"], said


def test_a_check_runs_inside_the_job(lab):
    said = lab.run(A_RIGHT_TRY_GPU_CHECKED)
    assert "try_gpu" in said and "Traceback" not in said, said
    assert "2 of 2 public checks passed" in said, said


def test_stopping_the_lab_through_the_hub_ends_its_job(slurm, hub, lab):
    [job] = slurm.jobs(hub.account)
    lab.stop_lab()
    left = slurm.jobs(hub.account)
    assert left == [], f"the hub stopped the lab, but its job goes on: {left}"
    # Slurm keeps an ended job's record for MinJobAge (300 s): long after this line.
    records = slurm.job_records(job["id"])
    assert [r.get("JobState") for r in records] == ["CANCELLED"], records or slurm.logs()
