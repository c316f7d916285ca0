"""The class's JupyterHub: its logins and its two spawners (the GPUs it hands out are in
lab_gpus.py, the check of the Python the labs run in lab_python.py, and the control groups that
hold its labs in lab_groups.py).

`jupyterhub_config.py`, beside this file, reads the instructor's settings and puts these
pieces together; they live here so that tests can use them without a running hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import pwd
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from nativeauthenticator import NativeAuthenticator
from tornado import web
from tornado.ioloop import PeriodicCallback
from traitlets import Float, List, Unicode

from hub.lab_gpus import visible_gpus
from hub.lab_groups import lab_groups
from hub.lab_python import FIX_PYTHON, probe_lab_python

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

EXCHANGE_IN_CONTAINERS = "/srv/nbgrader/exchange"  # nbgrader's own default


def open_exchange(path: str) -> str:
    """Make nbgrader's exchange folder, open to every student's account as /tmp is (anyone may
    add, only the owner may remove); nbgrader sets the modes of what it puts inside."""
    folder = Path(path).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if folder.stat().st_uid == os.geteuid():
        folder.chmod(0o1777)
    return str(folder)


def read_class_list(path: str | os.PathLike) -> list[str]:
    """The student names in a class list: one per line (or the first column of a CSV)."""
    names = []
    text = Path(path).read_text(encoding="utf-8")
    for number, row in enumerate(csv.reader(text.splitlines()), 1):
        name = row[0].strip().lower() if row else ""
        if not name or name.startswith("#") or (number == 1 and name in ("name", "username")):
            continue
        if not all(c.isalnum() or c in "-_." for c in name) or not name[0].isalnum():
            raise SystemExit(
                f"hub: {path}, line {number}: {row[0]!r} is not a name a student can log in "
                "with; use letters, digits, '-', '_' or '.', starting with a letter or digit"
            )
        names.append(name)
    return names


class ClassAuthenticator(NativeAuthenticator):
    """NativeAuthenticator that gives the instructor and every student of the class list an
    account with a first password of its own, written to a file only the hub's user reads.

    The class list is reread while the hub runs (every few seconds, and at each login): a
    student added gets an account and a password, one removed can no longer log in, and the
    labs already running go on. Anyone else may sign up, and waits until the instructor
    authorizes them (/hub/authorize).
    """

    passwords_file = Unicode("", config=True, help="Where new accounts' passwords are written.")
    class_list = Unicode("", config=True, help="The class list, reread while the hub runs.")
    reread_seconds = Float(5.0, config=True, help="How often the class list is looked at.")
    _read_stamp: tuple[int, int] | None = None  # the class list's (mtime, size) when last read

    def get_handlers(self, app):
        # Called while the hub starts, in its running event loop: reread from then on.
        if self.class_list:
            self.reread_class_list()
            PeriodicCallback(self.reread_class_list, self.reread_seconds * 1000).start()
        return super().get_handlers(app)

    async def authenticate(self, handler, data):
        self.reread_class_list()  # a student added a moment ago can log in at once
        return await super().authenticate(handler, data)

    def add_user(self, user):
        # The hub calls this for every user it knows at start and for each one added later.
        result = super().add_user(user)
        if user.name in self.admin_users or user.name in self.allowed_users:
            self.make_account(user.name)
        return result

    def make_account(self, name: str) -> None:
        """Give `name` an authorized login: a new one with a first password written to the
        passwords file, or the old one authorized again (a student put back on the list)."""
        info = self.get_user(name)
        if info is not None:
            if not info.is_authorized:
                info.is_authorized = True
                self.db.commit()
                self.log.info("hub: %s is on the class list again and may log in", name)
            return
        if not self.passwords_file:
            return
        password = secrets.token_urlsafe(9)
        if self.create_user(name, password) is None:
            self.log.error("hub: could not make an account for %s", name)
            return
        path = Path(self.passwords_file)
        new = not path.exists()
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a") as f:
            if new:
                f.write("name,password\n")
            f.write(f"{name},{password}\n")
        self.log.info("hub: made an account for %s; its password is in %s", name, path)

    def reread_class_list(self) -> None:
        """Apply the class list's changes since it was last read, if it has any."""
        try:
            stat = os.stat(self.class_list)
        except FileNotFoundError:
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._read_stamp:
            return
        self._read_stamp = stamp
        try:
            names = set(read_class_list(self.class_list))
        except SystemExit as bad:  # a name no one can log in with: keep the list in use
            self.log.error("%s; the class list in use stays as it was", bad)
            return
        added, removed = names - self.allowed_users, self.allowed_users - names
        self.allowed_users = names
        for name in sorted(added):
            self.log.info("hub: %s was added to the class list", name)
            self.make_account(name)
        for name in sorted(removed):
            if name in self.admin_users:
                self.log.info("hub: %s left the class list and, as the hub's admin, may still "
                              "log in", name)  # fmt: skip
                continue
            info = self.get_user(name)
            if info is not None:
                info.is_authorized = False
                self.db.commit()
            self.log.info("hub: %s left the class list and can no longer log in", name)


def remove_account(account: str, timeout: float = 30) -> bool:
    """Kill `account`'s processes and remove it with its home; return whether it is gone.
    userdel refuses (exit 8) while a process killed a moment ago has not yet ended, so it is
    asked again until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        subprocess.run(["pkill", "-KILL", "-u", account], capture_output=True)
        done = subprocess.run(["userdel", "--remove", account], capture_output=True)
        if done.returncode != 8 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    try:
        pwd.getpwnam(account)
    except KeyError:
        return True
    return False


MADE = "made.json"  # in the state folder: what the hub made outside it, for hub.clear


def record_made(state: Path, **made: str) -> None:
    """Write down, in `state`, the students' accounts' prefix and the folders the hub made
    for them (their homes, the exchange, their Python), which `make hub-clear` reads."""
    (state / MADE).write_text(json.dumps(made, indent=1) + "\n")


def listens(host: str, port: int) -> bool:
    """Whether something takes connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


class LabCannotStart(web.HTTPError):
    """A lab that cannot start: the hub logs `for_the_log`, and shows the student
    `for_the_student` (JupyterHub shows a spawn's failure by its `jupyterhub_message`)."""

    def __init__(self, for_the_log: str, for_the_student: str) -> None:
        super().__init__(503, "%s", for_the_log)
        self.jupyterhub_message = for_the_student


class LabProcessSpawner(LocalProcessSpawner):
    """Serves a student's lab as a process of the lab's virtual environment.

    Run by root, each student's lab runs as a system account of their own, `<prefix><name>`,
    made at the first start with its home under `homes`. Run by anyone else, every lab runs
    as that user, with a home per student under `homes`: for trying the hub out, not for a
    class, as students could then read each other's files.

    Each lab runs in a control group of its own (`LabGroups`), with `mem_limit` and
    `cpu_limit`, where the machine lets the hub make one; stopping the lab stops every
    process in it (and, run by root, every process of the student's account). It sees the
    GPUs `gpus` says, through CUDA_VISIBLE_DEVICES, and keeps its temporary files in its
    home (TMPDIR is ~/.tmp), which goes with the account after the course.
    """

    homes = Unicode("/home", config=True, help="Where the students' homes are made.")
    prefix = Unicode("lab-", config=True, help="Put before a student's name for their account.")
    python = Unicode(sys.executable, config=True, help="The lab's Python.")
    gpus = Unicode(
        "all", config=True, help="The GPUs a lab sees: all, each (one of gpu_ids each) or none."
    )
    gpu_ids = List(Unicode(), config=True, help="The GPUs handed out one each (gpus='each').")
    gpu_turns = Unicode("", config=True, help="Where each student's GPU is remembered.")

    @property
    def isolated(self) -> bool:
        return os.geteuid() == 0

    @property
    def account(self) -> str:
        return self.prefix + self.user.name

    @property
    def home(self) -> str:
        if self.isolated:
            return pwd.getpwnam(self.account).pw_dir
        return os.path.join(self.homes, self.user.name)

    @property
    def tmpdir(self) -> str:
        """The lab's temporary folder (TMPDIR), in its home: what the Terminal's start, torch
        and the grader's warm server leave there goes with the home."""
        return os.path.join(self.home, ".tmp")

    def _make_account(self) -> bool:
        """Make the student's account where it is missing; True where it was made now."""
        try:
            pwd.getpwnam(self.account)
            return False
        except KeyError:
            pass
        home = os.path.join(self.homes, self.account)
        subprocess.run(
            ["useradd", "--create-home", "--home-dir", home, "--shell", "/bin/bash",
             "--user-group", "--no-log-init", self.account],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        os.chmod(home, 0o700)
        self.log.info("hub: made the account %s for %s", self.account, self.user.name)
        return True

    def _check_reach(self) -> str:
        """Return the folder of the lab that the lab's Python runs (its start script, its
        released notebooks), as the student's account finds it; fail with a page that tells
        the student to tell the instructor, and a log line that tells the instructor what to
        do, where that account cannot start a lab with it."""
        lab, said = probe_lab_python(self.python, self.account)
        if said:
            raise LabCannotStart(
                f"{self.account} cannot start a lab with {self.python}: {said}. {FIX_PYTHON}",
                f"Your lab could not start: the hub's Python for the labs ({self.python}) "
                f"does not run for your lab's account ({self.account}). This is not "
                "something you did: please tell your instructor, whose hub log says how "
                "to fix it.",
            )
        return lab

    lab = Unicode(str(REPO), help="The lab the Python runs: found from it at each start.")

    # Set by a start that made the account, until the lab stops: a lab that never answered
    # leaves no account behind (the next start makes it again).
    _account_made_for_this_start = False

    # The files that the lab's first process writes its id to, to join its control groups.
    _joins: list[Path] = []  # (each start sets its own)

    async def start(self):
        if self.isolated:
            self._account_made_for_this_start = self._make_account()
            try:  # (a probe of a second or so, which the hub's other users need not wait for)
                self.lab = await asyncio.to_thread(self._check_reach)
                self.cmd = [os.path.join(self.lab, "docker", "start-lab")]
                self._joins = await asyncio.to_thread(self._make_group)
                return await self._start_and_listen()
            except Exception:  # (what the lab started is in its group; a new account goes)
                await asyncio.to_thread(self._end_group, every_process_of_the_account=False)
                self._forget_a_new_account()
                raise
        os.makedirs(self.home, exist_ok=True)
        self._joins = await asyncio.to_thread(self._make_group)
        return await self._start_and_listen()

    def _make_group(self) -> list[Path]:
        """Make the lab's control group with its limits; the files to join it by, or none
        (the hub's log says why) where there is none."""
        groups = lab_groups()
        if not groups.version:
            said = (
                "hub: the lab of %s runs without a memory or CPU limit: %s (the hub's log "
                "said at its start what to do)"
            )
            self.log.warning(said, self.user.name, groups.why)
            return []
        try:
            joins = groups.make(self.account, self.mem_limit, self.cpu_limit)
        except OSError as error:
            said = (
                "hub: the lab of %s runs without a memory or CPU limit, as its control "
                "group could not be made: %s"
            )
            self.log.error(said, self.user.name, error)
            groups.remove(self.account)
            return []
        memory = f"{self.mem_limit / 2**30:.3g} GiB" if self.mem_limit else "no limit"
        said = "hub: the lab of %s runs in the control group %s (memory: %s; CPUs: %s)"
        self.log.info(said, self.user.name, self.account, memory, self.cpu_limit or "no limit")
        return joins

    def _end_group(self, every_process_of_the_account: bool = True) -> None:
        """Stop every process the lab left (a warm server, a kernel's children) and remove
        its control group; run by root, every process of the student's account too."""
        groups = lab_groups()
        if groups.version and not groups.remove(self.account):
            self.log.error("hub: could not empty and remove the control group of %s's lab",
                           self.user.name)  # fmt: skip
        if self.isolated and every_process_of_the_account:
            subprocess.run(["pkill", "-KILL", "-u", self.account], capture_output=True)

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await asyncio.to_thread(self._end_group)

    async def _start_and_listen(self) -> tuple[str, int]:
        """Start the lab's process and wait until it listens on its port. A lab whose process
        ends first, or that never listens, fails with a page for the student, where the hub
        alone would wait out its `http_timeout` and then show its own generic error."""
        ip, port = await super().start()
        deadline = time.monotonic() + self.http_timeout
        while time.monotonic() < deadline:
            status = await self.poll()
            if status is not None:
                raise LabCannotStart(
                    f"the lab of {self.user.name} ({self.cmd[0]}, pid {self.pid}) ended with "
                    f"status {status} before it listened on port {port}; its own output is "
                    "above in this log",
                    f"Your lab stopped while it was starting (status {status}). This is not "
                    "something you did: please tell your instructor, whose hub log shows why.",
                )
            if await asyncio.to_thread(listens, ip or "127.0.0.1", port):
                return ip, port
            await asyncio.sleep(0.25)
        raise LabCannotStart(
            f"the lab of {self.user.name} ({self.cmd[0]}, pid {self.pid}) did not listen on "
            f"port {port} within {self.http_timeout:.0f} s (Spawner.http_timeout); it is "
            "stopped. Its own output is above in this log",
            f"Your lab did not open within {self.http_timeout:.0f} seconds and was stopped. "
            "Please try again in a minute, and tell your instructor if it happens again.",
        )

    def run_post_stop_hook(self):
        # The hub stops a lab that never answered (it timed out, its process ended) before
        # it gives up on the start, whose future is then still running. A lab that answered
        # keeps its account, whatever happens at its later starts.
        spawning = self._spawn_future is not None and not self._spawn_future.done()
        if self.isolated and spawning:
            self._forget_a_new_account()
        self._account_made_for_this_start = False
        return super().run_post_stop_hook()

    def _forget_a_new_account(self) -> None:
        """Remove the account this start made (its processes, its home), if it made one."""
        if not self._account_made_for_this_start:
            return
        self._account_made_for_this_start = False
        subprocess.run(["pkill", "-KILL", "-u", self.account], capture_output=True)
        gone = subprocess.run(["userdel", "--remove", self.account], capture_output=True,
                              text=True)  # fmt: skip
        if gone.returncode not in (0, 6):  # 6: no such account
            self.log.error("hub: could not remove the account %s, made for a lab that did "
                           "not start: %s", self.account, gone.stderr.strip())  # fmt: skip
        else:
            self.log.info("hub: removed the account %s: its lab did not start", self.account)

    def make_preexec_fn(self, name):
        # Run in the lab's first process before it starts the lab: it joins the lab's
        # control groups while it is still root's (every process of the lab then starts in
        # them), becomes the student's, and makes its temporary folder as theirs.
        from jupyterhub.spawner import set_user_setuid

        joins, home, tmpdir = list(self._joins), self.home, self.tmpdir
        become = set_user_setuid(self.account) if self.isolated else None

        def preexec():
            for path in joins:
                with open(path, "w") as procs:
                    procs.write(str(os.getpid()))
            if become is not None:
                become()
            else:
                os.chdir(home)
            with contextlib.suppress(FileExistsError):
                os.mkdir(tmpdir, 0o700)

        return preexec

    def user_env(self, env):
        env["USER"] = self.account if self.isolated else self.user.name
        env["HOME"] = self.home
        env["SHELL"] = "/bin/bash"
        return env

    def get_env(self):
        env = super().get_env()
        env.update(
            LAB_PYTHON=self.python,
            LAB_EXERCISES=os.path.join(self.lab, "exercises"),
            LAB_WORK=os.path.join(self.home, "work"),
            PATH=os.path.dirname(self.python) + os.pathsep + env.get("PATH", os.defpath),
            TMPDIR=self.tmpdir,
        )
        gpus = visible_gpus(self.gpus, list(self.gpu_ids), self.gpu_turns, self.user.name)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        return env

    def move_certs(self, paths):
        return paths  # the hub and its labs speak plain HTTP on one machine


def container_engine_answers() -> bool:
    """Whether a Docker-compatible engine answers here (Docker, or podman's socket)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host[len("unix://") :]):
        return False
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:
        return False
