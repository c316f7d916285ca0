"""The fence around the grading child: what it may not do, and who enforces it.

Two layers:
- the operating system, where it allows: the child gets its own network namespace (no
  network at all) and mount namespace (the hidden checks, the reference solutions, the
  mistake catalogue and the repository's history are covered by empty folders), runs
  under a user id of its own when the grader runs as root (so it can touch neither the
  grader's files nor another child's), and keeps no capabilities;
- Python's audit hooks, always, inside the child: no sockets, no new processes, no reading
  of the private folders, no writing outside the child's own scratch folder.

The audit layer alone can be got round with ctypes; it is the fallback where the system
allows no namespaces (`describe()` says which layers are on).
"""

import itertools
import os
import resource
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from grader.manifest import REPO, solutions_dir


def private_paths() -> list[Path]:
    """Return the folders the student's code must not read."""
    folders = [
        solutions_dir(),
        REPO / "grader" / "hidden",
        REPO / "grader" / "mistakes",
        REPO / ".git",
    ]
    return [p.resolve() for p in folders if p.exists()]


CHILD_UIDS = range(61000, 65000)  # one per grading child when the grader runs as root
_next_uid = itertools.count()
_uid_lock = threading.Lock()


def next_child_uid() -> int:
    """Return a user id for the next child, so that no two children share one."""
    with _uid_lock:
        return CHILD_UIDS[next(_next_uid) % len(CHILD_UIDS)]


@dataclass(frozen=True)
class Fence:
    """How the child is started, and what that enforces."""

    namespaces: str  # "" (none), "root" (made as root) or "user" (in a user namespace)
    own_uid: bool  # the child runs under a user id of its own
    description: str

    def prefix(self, uid: int | None) -> list[str]:
        """Return the words before `python` for a child running as `uid` (if own_uid)."""
        if not self.namespaces:
            return []
        script = _mask_script(uid if self.own_uid else None)
        user = ["--user", "--map-root-user"] if self.namespaces == "user" else []
        return ["unshare", *user, "--net", "--mount", "sh", "-c", script, "fence"]


def _mask_script(uid: int | None) -> str:
    """Return the shell lines run inside the new namespaces before Python starts."""
    lines = ["set -e", "mount --make-rprivate /"]
    lines += [
        f"mount -t tmpfs -o size=16k,mode=000 tmpfs {shlex.quote(str(p))}" for p in private_paths()
    ]
    drop = ["setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
    if uid is not None:
        drop += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    lines.append("exec " + " ".join(drop) + ' "$@"')
    return "; ".join(lines)


def _works(fence: Fence) -> bool:
    probe = [*fence.prefix(CHILD_UIDS[-1]), sys.executable, "-c", "import grader.api"]
    try:
        proc = subprocess.run(
            probe, capture_output=True, timeout=60, stdin=subprocess.DEVNULL, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@cache
def choose_fence() -> Fence:
    """Return the strongest fence this machine allows (probed once per process)."""
    none = Fence("", False, "no operating-system fence: Python's audit hooks only")
    if os.environ.get("GRADER_FENCE") == "none" or not shutil.which("unshare"):
        return none
    masked = "own network and mount namespaces, private folders masked"
    candidates = [Fence("user", False, f"{masked} (in a user namespace)")]
    if os.geteuid() == 0:
        candidates = [
            Fence("root", True, f"{masked}, a user id of its own per child"),
            Fence("root", False, f"{masked}, runs as root without capabilities"),
            *candidates,
        ]
    return next((f for f in candidates if _works(f)), none)


MAX_FILE = 256 * 2**20  # no file the child writes may grow beyond this


def limit_process(pid: int, memory_gib: float) -> None:
    """Set a started child's limits: data memory, file size, no core dumps."""
    if memory_gib > 0:
        size = int(memory_gib * 2**30)
        resource.prlimit(pid, resource.RLIMIT_DATA, (size, size))
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (MAX_FILE, MAX_FILE))
    resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))


# ---- inside the child ----------------------------------------------------------------------

_NETWORK = {
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.sendmsg",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
}
_PROCESSES = {
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
}
_CHANGES = {
    "os.remove",
    "os.rename",
    "os.rmdir",
    "shutil.rmtree",
    "os.truncate",
    "os.chmod",
    "os.chown",
    "os.symlink",
    "os.link",
    "shutil.move",
    "os.mkdir",
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Fenced(PermissionError):
    """Something the grading child does not allow."""


def install_audit_hook(scratch: Path, private: list[Path]) -> None:
    """Refuse network use, new processes, reading private folders and writing elsewhere."""
    allowed = [scratch.resolve(), Path("/dev")]

    def under(path, roots) -> bool:
        try:
            resolved = Path(os.fsdecode(path)).resolve()
        except (TypeError, ValueError, OSError):
            return False
        return any(resolved == r or r in resolved.parents for r in roots)

    def hook(event: str, args: tuple) -> None:
        if event in _NETWORK:
            raise Fenced("network use is not allowed while grading")
        if event in _PROCESSES:
            raise Fenced("starting processes is not allowed while grading")
        if event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
            path, mode, flags = (list(args) + [None, 0])[:3]
            if under(path, private):
                raise Fenced(f"{os.fsdecode(path)} is private to the grader")
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writing and not under(path, allowed):
                raise Fenced(f"writing {os.fsdecode(path)} is not allowed while grading")
        elif event in _CHANGES and args and isinstance(args[0], str | bytes | os.PathLike):
            for path in args[:2]:
                if isinstance(path, str | bytes | os.PathLike) and not under(path, allowed):
                    raise Fenced(f"changing {os.fsdecode(path)} is not allowed while grading")

    sys.addaudithook(hook)
