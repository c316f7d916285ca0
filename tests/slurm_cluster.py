"""A real one-node Slurm cluster for the tests: a munged of its own, and slurmctld and
slurmd on a configuration of their own (free ports; settings, state and logs in one folder).
This machine is the controller and the only node, in the partition `lab`, with one stand-in
GPU (/dev/null in gres.conf, so that `--gres=gpu:1` is granted as on a GPU node).

    if why := cluster_missing():
        pytest.skip(why)
    with one_node_cluster() as slurm:  # slurm.conf, .node, .partition, .env (SLURM_CONF set)
        slurm.run("sinfo")

Needs root and `apt install slurm-wlm munge`; `cluster_missing` says which is lacking."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TOOLS = ("munged", "munge", "unmunge", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue",
         "scancel", "sinfo", "scontrol")  # fmt: skip
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
PARTITION = "lab"
# The states after which a job runs no more.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}
# Seconds past a job's time limit by which slurmctld has noticed it (it looks every 30 s or so)
# and ended it; a test that waits longer than limit and grace is waiting on a silent cluster.
SLURM_GRACE = 120


def cluster_missing() -> str:
    """What this machine lacks to run a one-node Slurm cluster here, or ''."""
    if os.geteuid() != 0:
        return "Slurm's daemons need root: run the test as root"
    lacking = [tool for tool in TOOLS if not shutil.which(tool, path=SEARCH)]
    if lacking:
        return f"no {', '.join(lacking)} here: apt install slurm-wlm munge"
    return ""


def tool(name: str) -> str:
    return shutil.which(name, path=SEARCH) or name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Munge:
    """A munged of this cluster's own, as the `munge` user, with its key, socket and log in
    `folder`: test modules that run side by side (pytest-xdist) each start a cluster, and one
    stopping a shared munged would cut the others' jobs off from it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = folder / "munge.socket"
        self.started = False

    def answers(self) -> bool:
        where = f"--socket={self.socket}"
        made = subprocess.run([tool("munge"), where, "-n"], capture_output=True)
        read = subprocess.run([tool("unmunge"), where], input=made.stdout, capture_output=True)
        return made.returncode == 0 and read.returncode == 0

    def start(self) -> None:
        self.folder.mkdir(mode=0o755)
        shutil.chown(self.folder, "munge", "munge")
        as_munge = ["runuser", "-u", "munge", "--"]
        key = self.folder / "munge.key"
        subprocess.run([*as_munge, tool("mungekey"), "--create", f"--keyfile={key}"],
                       check=True, capture_output=True)  # fmt: skip
        subprocess.run(
            [*as_munge, tool("munged"), "--force", f"--socket={self.socket}",
             f"--key-file={key}", f"--pid-file={self.folder / 'munged.pid'}",
             f"--log-file={self.folder / 'munged.log'}",
             f"--seed-file={self.folder / 'munged.seed'}"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.started = True
        deadline = time.monotonic() + 10
        while not self.answers():
            if time.monotonic() > deadline:
                log = self.folder / "munged.log"
                raise RuntimeError(f"munged did not answer in 10 s: {log.read_text()[-500:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.started:
            subprocess.run(["runuser", "-u", "munge", "--", tool("munged"), "--stop",
                            f"--socket={self.socket}"], capture_output=True)  # fmt: skip


class Slurm:
    """A one-node cluster whose settings, state and logs are in `folder`: this machine is its
    controller and its only node, in the partition `lab`, with one stand-in GPU."""

    partition = PARTITION

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.pids: list[Path] = []
        self.node = ""

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
            f"SlurmctldPort={free_port()}\nSlurmdPort={free_port()}\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={f}/munge/munge.socket\n"
            f"StateSaveLocation={f}/state\nSlurmdSpoolDir={f}/spool\n"
            f"SlurmctldPidFile={f}/slurmctld.pid\nSlurmdPidFile={f}/slurmd.pid\n"
            f"SlurmctldLogFile={f}/slurmctld.log\nSlurmdLogFile={f}/slurmd.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU_Memory\n"
            "MpiDefault=none\nReturnToService=2\nGresTypes=gpu\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            f"{node} Gres=gpu:1 State=UNKNOWN\n"
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE "
            "State=UP\n"
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

    def job_records(self, job: str) -> list[dict[str, str]]:
        """`scontrol show job` of a job (every task of an array job), one dict per record:
        JobState, ExitCode, StartTime, EndTime, ArrayTaskId... Slurm keeps a finished job's
        record for MinJobAge (300 s), which is how long this cluster can tell of it."""
        shown = self.run("scontrol", "-o", "show", "job", job, check=False)
        return [
            dict(field.split("=", 1) for field in line.split() if "=" in field)
            for line in shown.splitlines()
            if line.strip()
        ]

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:]
                         for p in sorted(self.folder.glob("*.log")))  # fmt: skip

    def stop(self) -> None:
        # Jobs first, so that none is left running without its daemons; then whatever of
        # theirs still lives (a job step whose authentication failed, say) is killed by the
        # cluster's configuration in its environment.
        jobs = subprocess.run([tool("squeue"), "-h", "-o", "%A"], env=self.env,
                              capture_output=True, text=True).stdout.split()  # fmt: skip
        if jobs:
            subprocess.run([tool("scancel"), *jobs], env=self.env, capture_output=True)
            time.sleep(1)
        self._stop_daemons()
        for pid in self._processes_of_its_jobs():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _processes_of_its_jobs(self) -> list[int]:
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError):
                if mark in environ.read_bytes().split(b"\0"):
                    found.append(int(environ.parent.name))
        return [pid for pid in found if pid != os.getpid()]

    def _stop_daemons(self) -> None:
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


@contextmanager
def one_node_cluster(folder: Path | None = None) -> Iterator[Slurm]:
    """Start a munged and a one-node cluster in `folder` (a new temporary
    folder if None, removed afterwards); stop them on leaving. Ask `cluster_missing` first."""
    made = folder is None
    folder = Path(tempfile.mkdtemp(prefix="lab-slurm-")) if folder is None else Path(folder)
    folder.chmod(0o755)  # other accounts' sbatch (the hub's students) read slurm.conf
    munge, cluster = Munge(folder / "munge"), Slurm(folder)
    try:
        munge.start()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        munge.stop()
        if made:
            shutil.rmtree(folder, ignore_errors=True)
