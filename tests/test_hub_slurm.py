"""A class's hub on Slurm, for real: a one-node Slurm cluster (munged, slurmctld and slurmd on
a configuration of its own, on free ports) and the hub started with docs/hub/slurm_config.py.
A student logs in and their lab runs as a batch job of their own system account; stopping the
lab through the hub ends the job.

The node has no GPU: /dev/null stands in for one in its gres.conf, so that the lab's
`--gres=gpu:1` is granted and Slurm hands the job a device, as it would on a GPU node. Needs
root and `apt install slurm-wlm munge`."""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hub"))

import running  # noqa: E402

pytestmark = pytest.mark.slow
CONFIG = REPO / "docs" / "hub" / "slurm_config.py"
STUDENT = "ann"
NOTEBOOKS = {"concise.ipynb", "distributed.ipynb", "from_scratch.ipynb"}
TOOLS = ("munged", "munge", "unmunge", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue",
         "scancel", "sinfo", "scontrol")  # fmt: skip
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def cluster_missing() -> str:
    """What this machine lacks to run a one-node Slurm cluster here, or ''."""
    if os.geteuid() != 0:
        return "Slurm's daemons and the students' accounts need root: run the test as root"
    lacking = [tool for tool in TOOLS if not shutil.which(tool, path=SEARCH)]
    if lacking:
        return f"no {', '.join(lacking)} here: apt install slurm-wlm munge"
    return ""


def tool(name: str) -> str:
    return shutil.which(name, path=SEARCH) or name


class Munge:
    """munged on its usual socket, which Slurm's tools use: the one running, or one started
    here as the `munge` user (and stopped again by `stop`)."""

    def __init__(self) -> None:
        self.started = False

    def answers(self) -> bool:
        made = subprocess.run([tool("munge"), "-n"], capture_output=True)
        read = subprocess.run([tool("unmunge")], input=made.stdout, capture_output=True)
        return made.returncode == 0 and read.returncode == 0

    def start(self) -> None:
        if self.answers():
            return
        for folder, mode in (("/etc/munge", 0o700), ("/var/lib/munge", 0o711),
                             ("/var/log/munge", 0o700), ("/run/munge", 0o755)):  # fmt: skip
            if not os.path.isdir(folder):
                os.makedirs(folder, mode)
                shutil.chown(folder, "munge", "munge")
        as_munge = ["runuser", "-u", "munge", "--"]
        if not os.path.exists("/etc/munge/munge.key"):
            subprocess.run([*as_munge, tool("mungekey"), "--create"], check=True)
        subprocess.run([*as_munge, tool("munged")], check=True, capture_output=True)
        self.started = True
        deadline = time.monotonic() + 10
        while not self.answers():
            if time.monotonic() > deadline:
                raise RuntimeError("munged did not answer in 10 s: see /var/log/munge/munged.log")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.started:
            subprocess.run(["runuser", "-u", "munge", "--", tool("munged"), "--stop"],
                           capture_output=True)  # fmt: skip


class Slurm:
    """A one-node cluster whose settings, state and logs are in `folder`: this machine is its
    controller and its only node, in the partition `lab`, with one stand-in GPU."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.pids: list[Path] = []

    def write(self) -> None:
        # slurmd -C says what this machine has, as slurm.conf must: NodeName=... CPUs=...
        found = subprocess.run([tool("slurmd"), "-C"], capture_output=True, text=True, check=True)
        node = found.stdout.splitlines()[0]
        self.node = node.split()[0].removeprefix("NodeName=")
        for name in ("state", "spool"):
            (self.folder / name).mkdir()
        f = self.folder
        self.conf.write_text(
            f"ClusterName=labtest\nSlurmctldHost={self.node}\nSlurmUser=root\n"
            f"SlurmctldPort={running.free_port()}\nSlurmdPort={running.free_port()}\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            f"StateSaveLocation={f}/state\nSlurmdSpoolDir={f}/spool\n"
            f"SlurmctldPidFile={f}/slurmctld.pid\nSlurmdPidFile={f}/slurmd.pid\n"
            f"SlurmctldLogFile={f}/slurmctld.log\nSlurmdLogFile={f}/slurmd.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU_Memory\n"
            "MpiDefault=none\nReturnToService=2\nGresTypes=gpu\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            f"{node} Gres=gpu:1 State=UNKNOWN\n"
            f"PartitionName=lab Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n"
        )
        (self.folder / "gres.conf").write_text(f"NodeName={self.node} Name=gpu File=/dev/null\n")

    def start(self, timeout: float = 30) -> None:
        self.write()
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([tool(daemon), "-f", str(self.conf)], env=self.env, check=True)
            self.pids.append(self.folder / f"{daemon}.pid")
        deadline = time.monotonic() + timeout
        while self.run("sinfo", "-h", "-n", self.node, "-o", "%t", check=False).strip() != "idle":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node is not idle after {timeout} s:\n{self.logs()}")
            time.sleep(0.3)

    def run(self, *command: str, check: bool = True) -> str:
        """What a Slurm tool prints, run against this cluster; it fails if the tool does."""
        done = subprocess.run([tool(command[0]), *command[1:]], env=self.env,
                              capture_output=True, text=True)  # fmt: skip
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}\n{self.logs()}")
        return done.stdout

    def jobs(self, account: str) -> list[dict]:
        """The account's jobs that are waiting or running, as squeue lists them."""
        fields = ("id", "name", "user", "state", "node", "cpus", "memory", "time_limit", "gres")
        listed = self.run("squeue", "-h", "-u", account, "-o", "%i|%j|%u|%T|%N|%C|%m|%l|%b")
        return [dict(zip(fields, line.split("|"), strict=True)) for line in listed.splitlines()]

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:]
                         for p in sorted(self.folder.glob("*.log")))  # fmt: skip

    def stop(self) -> None:
        for path in reversed(self.pids):  # slurmd, then slurmctld
            try:
                pid = int(path.read_text())
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                os.kill(pid, signal.SIGKILL)


class SlurmHub(running.Hub):
    """running.Hub started with docs/hub/slurm_config.py instead of hub/jupyterhub_config.py."""

    def start(self, timeout: float = 60) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)],
            cwd=self.folder, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the hub stopped at start:\n{self.log_text()[-3000:]}")
            try:
                if requests.get(self.base + "/hub/api", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the hub did not answer in {timeout} s:\n{self.log_text()[-3000:]}")


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
    if why := cluster_missing() or running.missing():
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="lab-slurm-"))
    folder.chmod(0o755)  # the students' sbatch reads slurm.conf
    munge, cluster = Munge(), Slurm(folder)
    try:
        munge.start()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        munge.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    homes = running.temporary_homes()
    try:
        python = running.python_for_students(homes / "python")
        if not python:
            pytest.skip(
                f"no Python with the lab in it that other users may run: {sys.executable} lies "
                "in a folder closed to them and the system has no Python "
                f"{sys.version_info.major}.{sys.version_info.minor} to lend them"
            )
        lend_singleuser(python)
        prefix = f"t{secrets.token_hex(2)}-"
        hub = SlurmHub(
            tmp_path_factory.mktemp("hub"), [STUDENT], HUB_HOMES=str(homes),
            HUB_USER_PREFIX=prefix, HUB_PYTHON=python, HUB_SLURM_PARTITION="lab",
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
            while time.monotonic() < deadline and slurm.run(
                "squeue", "-h", "-u", hub.account, check=False
            ):
                time.sleep(0.3)
            subprocess.run(["pkill", "-KILL", "-u", hub.account], capture_output=True)
            subprocess.run(["userdel", "--remove", hub.account], capture_output=True)
    finally:
        shutil.rmtree(homes, ignore_errors=True)


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
    said = lab.run(
        "import torch\nfrom grader import check\n"
        "def try_gpu(i=0):\n"
        "    return torch.device(f'cuda:{i}') if torch.cuda.device_count() > i else "
        "torch.device('cpu')\n"
        "check('try_gpu', try_gpu)\n"
    )
    assert "try_gpu" in said and "Traceback" not in said, said
    assert "2 of 2 public checks passed" in said, said


def test_stopping_the_lab_through_the_hub_ends_its_job(slurm, hub, lab):
    [job] = slurm.jobs(hub.account)
    lab.stop_lab()
    assert slurm.jobs(hub.account) == []
    ended = slurm.run("scontrol", "show", "job", job["id"])
    assert "JobState=CANCELLED" in ended or not ended, ended
