# A class's JupyterHub on one machine: `make hub`, or the compose file's `hub` service.
# Every setting is an environment variable, so the same file serves both (docs/hub.md):
#
#   HUB_IP, HUB_PORT   where the hub listens                      (127.0.0.1, 8000)
#   HUB_API_PORT, HUB_PROXY_API_PORT   the hub's and its proxy's own APIs (8081, 8001)
#   HUB_STATE          the hub's database, secrets and passwords  (hub/state)
#   HUB_ADMIN          the instructor's login                     (instructor)
#   HUB_CLASS_LIST     a file of student names, one per line: each gets an account and a first
#                      password, written with the instructor's to $HUB_STATE/passwords.csv;
#                      reread while the hub runs (a name added gets an account within 5 s,
#                      one removed can no longer log in)      ($HUB_STATE/class.txt)
#   HUB_SPAWNER        docker (a container of the lab image per student; Docker, or podman's
#                      Docker-compatible socket) or process (the lab's virtual environment)
#                                                                 (docker where an engine answers)
#   HUB_IMAGE          the lab image                              (multigpu-lab/lab:0.1.0)
#   HUB_GPUS           all (every lab sees every GPU), each (one GPU per student, in turn,
#                      from HUB_GPU_IDS such as 0,1,2,3) or none: containers by the engine,
#                      processes by CUDA_VISIBLE_DEVICES          (none)
#   HUB_MEM_LIMIT, HUB_CPU_LIMIT   per lab: its container's, or its process's control group,
#                      with every process it starts               (8G, 4)
#   HUB_IDLE_TIMEOUT   seconds before an idle lab is stopped      (3600)
#   HUB_HOMES, HUB_USER_PREFIX     process spawner run by root: the students' accounts'
#                      homes and the start of their names         (/home, lab-)
#   HUB_PYTHON         process spawner: the Python of the lab, which the students' accounts
#                      must be able to run; run by root, the hub checks that `nobody` can
#                      before it starts         (the hub's own; run by root where the accounts
#                                                cannot run that, one made in HUB_PYTHON_FOLDER)
#   HUB_PYTHON_FOLDER  process spawner run by root, HUB_PYTHON unset: where the hub makes
#                      (once for each version of the lab) a Python with the lab in it that
#                      every account may run, from the system's Python of the same version,
#                      outside the checkout               (/var/lib/multigpu-lab/python)
#   HUB_EXCHANGE       nbgrader's exchange: the instructor releases the notebooks into it and
#                      collects them from it; the students fetch and submit them in their labs'
#                      Assignments tab. A folder on this machine (process spawner), or a volume
#                      or folder mounted in every lab (docker). Unset: the notebooks are copied
#                      into each lab at its first start.
#   HUB_COURSE         process spawner run by root: the instructor's course folder, where
#                      collect and grade write the submissions, the grades and the gradebook;
#                      the hub refuses to start while it, the lab's checkout or the state folder
#                      is open to other accounts (hub/closed.py)          (the lab's checkout)
#   LAB_LANG           zh_CN gives every student the Chinese notebooks
import os
import sys
from pathlib import Path

from hub.closed import check_closed, instructors_folders
from hub.lab_gpus import gpu_mode, lab_host_config
from hub.lab_groups import FIX_LIMITS, lab_groups
from hub.lab_hub import (
    EXCHANGE_IN_CONTAINERS,
    REPO,
    ClassAuthenticator,
    LabProcessSpawner,
    container_engine_answers,
    open_exchange,
    read_class_list,
    record_made,
)
from hub.lab_python import check_python_for_students

c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)
env = os.environ.get

state = Path(env("HUB_STATE") or REPO / "hub" / "state").resolve()
state.mkdir(parents=True, exist_ok=True)
os.chmod(state, 0o700)
c.JupyterHub.ip = env("HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(env("HUB_PORT", "8000"))
c.JupyterHub.hub_port = int(env("HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('HUB_PROXY_API_PORT', '8001')}"
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
proxy = REPO / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
if proxy.exists():
    c.ConfigurableHTTPProxy.command = [str(proxy)]

# Logins: NativeAuthenticator, sign-up closed to strangers. The instructor and the class list
# get accounts with first passwords; anyone else who signs up waits for the instructor.
admin = env("HUB_ADMIN", "instructor")
c.JupyterHub.authenticator_class = ClassAuthenticator
c.Authenticator.admin_users = {admin}
c.Authenticator.allow_all = True  # NativeAuthenticator's own authorization decides who enters
class_list = env("HUB_CLASS_LIST") or state / "class.txt"
if env("HUB_CLASS_LIST") or Path(class_list).exists():
    c.Authenticator.allowed_users = set(read_class_list(class_list))
c.ClassAuthenticator.passwords_file = str(state / "passwords.csv")
c.ClassAuthenticator.class_list = str(class_list)  # reread while the hub runs
c.NativeAuthenticator.open_signup = False
c.NativeAuthenticator.minimum_password_length = 8
c.NativeAuthenticator.check_common_password = True

# Each lab: JupyterLab on the student's work folder, its notebooks copied in on first start.
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90
c.Spawner.mem_limit = env("HUB_MEM_LIMIT", "8G")
c.Spawner.cpu_limit = float(env("HUB_CPU_LIMIT", "4"))
c.Spawner.environment = {"LAB_LANG": env("LAB_LANG", "")}

exchange = env("HUB_EXCHANGE", "")
if exchange:
    c.Spawner.environment["LAB_EXCHANGE"] = EXCHANGE_IN_CONTAINERS

gpu_ids = [g for g in env("HUB_GPU_IDS", "").split(",") if g]
spawner = env("HUB_SPAWNER") or ("docker" if container_engine_answers() else "process")
if spawner == "docker":
    c.JupyterHub.spawner_class = "docker"
    c.DockerSpawner.image = env("HUB_IMAGE", "multigpu-lab/lab:0.1.0")
    c.DockerSpawner.pull_policy = "never"  # the image is built here (docker compose build)
    c.DockerSpawner.remove = True  # the container goes, the student's volume stays
    c.DockerSpawner.volumes = {"lab-work-{username}": "/home/student/work"}
    if exchange:
        c.DockerSpawner.volumes[exchange] = EXCHANGE_IN_CONTAINERS
    # The GPUs, and a /dev/shm with room for DataLoader workers (64 MB by default).
    c.DockerSpawner.extra_host_config = lab_host_config(env("HUB_GPUS", "none"), gpu_ids, state)
    c.DockerSpawner.extra_create_kwargs = {"user": "1000"}
    if env("HUB_NETWORK"):  # the hub in a container: labs join its network
        c.DockerSpawner.network_name = env("HUB_NETWORK")
        c.DockerSpawner.use_internal_ip = True
        c.JupyterHub.hub_ip = "0.0.0.0"
        c.JupyterHub.hub_connect_ip = env("HUB_CONNECT_IP", "hub")
    else:  # labs publish a port on the loopback, where the proxy reaches them; they reach
        # the hub's API on this machine by the name the engine gives it inside containers
        c.DockerSpawner.host_ip = "127.0.0.1"
        c.JupyterHub.hub_ip = "0.0.0.0"
        host = env("HUB_CONNECT_IP", "host.containers.internal")  # Docker: host.docker.internal
        c.DockerSpawner.hub_connect_url = f"http://{host}:{c.JupyterHub.hub_port}"
elif spawner == "process":
    if os.geteuid() == 0:  # the students' accounts have Terminals: nothing of ours is open
        course = Path(env("HUB_COURSE") or REPO)
        check_closed(instructors_folders(REPO, course, state), exchange)
    c.JupyterHub.spawner_class = LabProcessSpawner
    c.LabProcessSpawner.cmd = [str(REPO / "docker" / "start-lab")]
    c.LabProcessSpawner.homes = env("HUB_HOMES") or (
        "/home" if os.geteuid() == 0 else str(state / "homes")
    )
    c.LabProcessSpawner.prefix = env("HUB_USER_PREFIX", "lab-")
    # Run by root, the labs run as the students' own accounts, which must be able to run
    # the lab's Python: a checkout's .venv under /root, or in a folder closed to others, is
    # not. Unless HUB_PYTHON names one, the hub then lends them one of its own making, outside
    # the checkout; either way it checks, before it takes a login, that `nobody` can start a
    # lab with it.
    python, folder = env("HUB_PYTHON") or sys.executable, None
    if os.geteuid() == 0 and not env("HUB_PYTHON"):
        from hub.running import lend_python

        folder = Path(env("HUB_PYTHON_FOLDER") or "/var/lib/multigpu-lab/python").resolve()
        try:
            python, made = lend_python(folder)
        except RuntimeError as error:
            raise SystemExit(f"hub: {error}. Or name a Python with HUB_PYTHON.") from None
        print(f"hub: {made}", file=sys.stderr)
    if os.geteuid() == 0:
        check_python_for_students(python)
    c.LabProcessSpawner.python = python
    if exchange:
        c.Spawner.environment["LAB_EXCHANGE"] = open_exchange(exchange)
        # the instructor's collect, run in their lab, maps each submission's owner back to
        # a student's name (hub/lab_exchange.py)
        c.Spawner.environment["HUB_USER_PREFIX"] = c.LabProcessSpawner.prefix
    # Each lab in a control group of its own with the limits above, seeing the GPUs HUB_GPUS
    # gives it (CUDA_VISIBLE_DEVICES); stopping it stops every process it started.
    c.LabProcessSpawner.gpus = gpu_mode(env("HUB_GPUS", "none"), gpu_ids)
    c.LabProcessSpawner.gpu_ids = gpu_ids
    c.LabProcessSpawner.gpu_turns = str(state / "gpus.json")
    groups = lab_groups()
    if groups.version:
        print(f"hub: each lab runs in a control group of its own ({groups.described()}), "
              f"with at most {c.Spawner.mem_limit} of memory and {c.Spawner.cpu_limit:g} CPUs",
              file=sys.stderr)  # fmt: skip
    else:
        print(f"hub: WARNING: the labs run without a memory or CPU limit: {groups.why}; one "
              f"student's runaway cell can slow or stop every lab. {FIX_LIMITS}.",
              file=sys.stderr)  # fmt: skip
    # For `make hub-clear` after the course: whose accounts, and which folders it keeps.
    record_made(state, prefix=c.LabProcessSpawner.prefix, homes=c.LabProcessSpawner.homes,
                exchange=c.Spawner.environment.get("LAB_EXCHANGE", ""),
                python_folder=str(folder or ""))  # fmt: skip
else:
    raise SystemExit(f"hub: HUB_SPAWNER={spawner!r}: say docker or process")

# An idle lab is stopped (its work stays); the culler runs as a service of the hub.
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={int(env('HUB_IDLE_TIMEOUT', '3600'))}",
        ],
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]
