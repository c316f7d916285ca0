"""Start a fenced grading child: forked by the fork server, or started afresh, with its
environment, its user and its limits."""

import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from grader.base.grading_devices import grading_mode
from grader.base.limits import Limits
from grader.base.protocol import ForkOrder
from grader.sandbox.fence import (
    WAIT_POLICY,
    Fence,
    choose_fence,
    ending_with_this_process,
    limit_process,
    next_child_uid,
    private_paths,
    with_import_path,
)
from grader.sandbox.speedups import ChildForker

# ---- starting a child --------------------------------------------------------------------


class Child(Protocol):
    """A started child: `subprocess.Popen`, or a child of the fork server."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


_children: set[Child] = set()
_children_lock = threading.Lock()


def stop_all_children() -> None:
    """Kill every grading child still running (on Ctrl-C)."""
    with _children_lock:
        for proc in list(_children):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass


def track(proc: Child) -> None:
    """Count `proc` among the children that `stop_all_children` stops."""
    with _children_lock:
        _children.add(proc)


def forget(proc: Child) -> None:
    """Stop counting `proc`, which has ended."""
    with _children_lock:
        _children.discard(proc)


def base_environment() -> dict[str, str]:
    """Return the environment every child shares."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADER_", "JUPYTER"))}
    env.update(
        MPLBACKEND="Agg",
        DPLAB_OFFLINE="1",
        DPLAB_DEVICES=grading_mode(),  # the same devices for every submission on this machine
        DPLAB_DATA_SOURCE="sample",  # the same data on every machine, full set installed or not
        PYTHONDONTWRITEBYTECODE="1",
    )
    return with_import_path(env)


def child_environment(scratch: Path, threads: int) -> dict[str, str]:
    """Return the environment of the child working in `scratch`."""
    env = base_environment()
    env.update(
        DPLAB_FIGURE_DIR=str(scratch),
        MPLCONFIGDIR=str(scratch / ".matplotlib"),
        HOME=str(scratch),
        OMP_NUM_THREADS=str(threads),
        TMPDIR=str(scratch / "tmp"),
    )
    env.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)  # see there
    return env


def children_fence(server) -> Fence:
    """Return the fence the children get: the one the fork server chose (no need to probe for
    it here too), else this process's."""
    return choose_fence() if server is None else server.fence


def start_child(
    request: Path,
    scratch: Path,
    threads: int,
    limits: Limits,
    report_fd: int,
    reply_fd: int,
    server: ChildForker | None,
    complete: bool = False,
) -> Child:
    """Start a fenced child on the request file `request`, from the fork `server` where there
    is one (the fast path's), else as a new Python. A `complete` child (its cases start
    process groups) starts with all the server imports (see forkserver.serve)."""
    fence = children_fence(server)
    uid = next_child_uid() if fence.own_uid else None
    if uid is not None:  # the scratch folder becomes this child's alone
        for p in [scratch, *scratch.rglob("*")]:
            os.chown(p, uid, uid)
    env = child_environment(scratch, threads)
    with open(scratch / "child.log", "ab") as log:
        if server is not None:
            order = ForkOrder(
                request=str(request),
                scratch=str(scratch),
                env=env,
                uid=uid,
                fence=asdict(server.fence),
                private=[str(p) for p in private_paths()],
                tmp=str(scratch / "tmp"),
                memory_gib=float(limits.memory_gib),
                complete=complete,
            )
            try:
                return server.fork(order, report_fd, reply_fd, log.fileno())
            except OSError:  # the server has gone: start this child afresh
                pass
        proc = _start_afresh(request, fence, uid, scratch, limits, env, log, (report_fd, reply_fd))
    try:
        limit_process(proc.pid, limits.memory_gib)
    except (ProcessLookupError, PermissionError):
        pass  # it has already ended, or the system does not allow it
    return proc


def _start_afresh(
    request: Path,
    fence: Fence,
    uid: int | None,
    scratch: Path,
    limits: Limits,
    env: dict[str, str],
    log,
    fds: tuple[int, int],
) -> subprocess.Popen:
    """Start the child as a new Python, behind `fence`, ending with the grader."""
    return subprocess.Popen(
        [
            *fence.prefix(uid, scratch / "tmp", limits.memory_gib),
            sys.executable,
            "-X",
            "faulthandler",
            "-m",
            "grader.sandbox.child",
            str(request),
            str(os.getpid()),
        ],
        cwd=scratch,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        pass_fds=fds,
        start_new_session=True,
        preexec_fn=ending_with_this_process(),  # this thread waits for it (run_child)
    )
