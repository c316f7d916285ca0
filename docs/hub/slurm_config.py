# A class's JupyterHub whose labs are Slurm jobs: `jupyterhub -f docs/hub/slurm_config.py`.
# It loads hub/jupyterhub_config.py (logins, class list, state, ports: see there) and then
# hands each student's lab to Slurm: a batch job (BatchSpawner's SlurmSpawner) submitted as
# the student's own account, `<HUB_USER_PREFIX><name>`, the account the process spawner uses,
# which runs docker/start-lab on the node the job gets. Run by root, the hub makes a missing
# account with useradd, on its own machine; on a cluster the accounts, the homes under
# HUB_HOMES and this repository's folder must be the same on every node (a shared user
# database and file system), so make the accounts there or in the cluster's directory.
#
#   HUB_SLURM_PARTITION  the partition the labs run in             (the cluster's default)
#   HUB_SLURM_GPUS       GPUs per lab, asked for as --gres=gpu:N; 0 asks for none    (1)
#   HUB_SLURM_CPUS       CPUs per lab (--cpus-per-task)                              (4)
#   HUB_SLURM_MEM        memory per lab (--mem), as 8G or 8000M; a bare number is M  (8G)
#   HUB_SLURM_TIME       the job's time limit (--time), after which the lab stops    (8:00:00)
#   HUB_SLURM_WAIT       seconds a lab may wait in the queue before the hub gives up (300)
#   HUB_CONNECT_IP       the name or address by which the nodes reach the hub's API
#                                                                 (this machine's host name)
#   HUB_HOMES, HUB_USER_PREFIX, HUB_PYTHON   as for the process spawner; HUB_PYTHON must
#                        have batchspawner installed and `jupyterhub-singleuser` beside it
#                        (any virtual environment with the hub's packages has both)
#   SLURM_CONF           where sbatch, squeue and scancel find the cluster's settings, when not
#                        in the usual place; passed on to the labs' jobs
import os
import pwd
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from batchspawner import SlurmSpawner
from traitlets import Unicode, default

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "hub" / "jupyterhub_config.py"
if not BASE.exists():  # load_subconfig would pass over a missing file without a word
    raise SystemExit(f"hub: {BASE} is missing; this file loads it")
os.environ.setdefault("HUB_SPAWNER", "process")  # not docker, even where an engine answers
load_subconfig(str(BASE))  # noqa: F821 (JupyterHub's config loader defines it)

from hub.lab_hub import LabProcessSpawner  # noqa: E402

c = get_config()  # noqa: F821
env = os.environ.get


class LabSlurmSpawner(SlurmSpawner):
    """Serves a student's lab as a Slurm job of their own account, through docker/start-lab."""

    homes = Unicode("/home", config=True, help="Where the students' homes are made.")
    prefix = Unicode("lab-", config=True, help="Put before a student's name for their account.")
    python = Unicode(sys.executable, config=True, help="The lab's Python, on every node.")

    # The process spawner's own ways to make the account and to check that it can run the lab.
    _make_account = LabProcessSpawner._make_account
    _check_python = LabProcessSpawner._check_reach

    @property
    def account(self) -> str:
        return self.prefix + self.user.name

    @property
    def home(self) -> str:
        return pwd.getpwnam(self.account).pw_dir

    @property
    def singleuser(self) -> str:
        return os.path.join(os.path.dirname(self.python), "jupyterhub-singleuser")

    @default("env_keep")
    def _hub_env_kept(self) -> list[str]:  # sbatch needs PATH and SLURM_CONF; the job, too
        return ["JUPYTERHUB_SINGLEUSER_APP", "LANG", "LC_ALL", "PATH", "SLURM_CONF"]

    @default("req_username")
    def _account_submits(self) -> str:  # {username} in exec_prefix: who runs sbatch
        return self.account

    @default("req_homedir")
    def _account_home(self) -> str:  # where the job starts and writes its log
        return self.home

    lab = Unicode(str(REPO), help="The lab the Python runs: found from it at each start.")

    def _check_reach(self) -> None:
        self.lab = self._check_python()  # the lab the student's Python runs, as they find it
        self.cmd = [os.path.join(self.lab, "docker", "start-lab")]
        entry = pwd.getpwnam(self.account)
        probe = subprocess.run(
            [self.python, "-c", "import batchspawner.singleuser"],
            user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/",
            capture_output=True, text=True,
        )  # fmt: skip
        if probe.returncode or not os.access(self.singleuser, os.X_OK):
            raise RuntimeError(
                f"{self.account} cannot start a lab as a Slurm job with {self.python}: it needs "
                f"batchspawner installed and {self.singleuser}; name a virtual environment "
                f"with the hub's packages in HUB_PYTHON. It said: {probe.stderr.strip()[-300:]}"
            )

    async def start(self):
        if os.geteuid() == 0:  # otherwise the accounts are the cluster's, made beforehand
            self._make_account()
            self._check_reach()
        return await super().start()

    def cmd_formatted_for_batch(self) -> str:
        # BatchSpawner puts `batchspawner-singleuser` before the command, which runs the command
        # as a Python file; start-lab is a shell script, so LAB_SINGLEUSER carries the wrapper
        # and start-lab hands it the single-user server after copying in the notebooks.
        return shlex.join(self.cmd + self.get_args())

    def user_env(self, env: dict) -> dict:
        env.update(USER=self.account, HOME=self.home, SHELL="/bin/bash")
        return env

    def get_env(self) -> dict:
        env = super().get_env()
        env.update(
            LAB_PYTHON=self.python,
            LAB_EXERCISES=os.path.join(self.lab, "exercises"),
            LAB_WORK=os.path.join(self.home, "work"),
            LAB_SINGLEUSER=f"{self.python} -m batchspawner.singleuser {self.singleuser}",
            PATH=os.path.dirname(self.python) + os.pathsep + env.get("PATH", os.defpath),
        )
        return env


c.JupyterHub.spawner_class = LabSlurmSpawner
c.LabSlurmSpawner.cmd = [str(REPO / "docker" / "start-lab")]
c.LabSlurmSpawner.homes = env("HUB_HOMES") or "/home"
c.LabSlurmSpawner.prefix = env("HUB_USER_PREFIX", "lab-")
if env("HUB_PYTHON"):
    c.LabSlurmSpawner.python = env("HUB_PYTHON")
# sbatch, squeue and scancel run as the student's account, so that the job is theirs. Run by
# root, the hub does that with runuser (util-linux, on every Linux), which needs neither sudo
# nor a sudoers rule and keeps the environment that the job's --export names. Run by another
# user, it needs sudo and a rule letting it run those three as the students' accounts.
if os.geteuid() == 0:
    c.LabSlurmSpawner.exec_prefix = "runuser -u {username} --"
else:
    c.LabSlurmSpawner.exec_prefix = "sudo -E -u {username}"

try:
    gpus = int(env("HUB_SLURM_GPUS", "1"))
except ValueError:
    raise SystemExit(
        f"hub: HUB_SLURM_GPUS={env('HUB_SLURM_GPUS')!r}: say how many, 0 for none"
    ) from None
c.LabSlurmSpawner.req_partition = env("HUB_SLURM_PARTITION", "")
c.LabSlurmSpawner.req_gres = f"gpu:{gpus}" if gpus > 0 else ""
c.LabSlurmSpawner.req_nprocs = env("HUB_SLURM_CPUS", "4")
memory = env("HUB_SLURM_MEM", "8G")
c.LabSlurmSpawner.req_memory = memory + "M" if memory.isdigit() else memory  # Slurm's unit
# The lab is told the same limits (MEM_LIMIT, CPU_LIMIT), not the process spawner's.
c.LabSlurmSpawner.cpu_limit = float(c.LabSlurmSpawner.req_nprocs)
c.LabSlurmSpawner.mem_limit = c.LabSlurmSpawner.req_memory
c.LabSlurmSpawner.req_runtime = env("HUB_SLURM_TIME", "8:00:00")
c.LabSlurmSpawner.start_timeout = int(env("HUB_SLURM_WAIT", "300"))

# The labs run on the nodes: they reach the hub's API over the network, not the loopback.
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = env("HUB_CONNECT_IP") or socket.gethostname()
