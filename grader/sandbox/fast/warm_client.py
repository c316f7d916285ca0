"""Find, start and connect to this user's warm server (`grader.front.warm_commands`), which
outlives the command that started it: where it listens, what names it, and which servers run."""

import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from grader import settings
from grader.sandbox.fast.preload import server_environment
from grader.sandbox.fence import (
    warm_folders,
)


def peer_uid(connection: socket.socket) -> int:
    """Return the user id of the process at the other end of a Unix socket."""
    pid_uid_gid = struct.Struct("3i")
    data = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, pid_uid_gid.size)
    return pid_uid_gid.unpack(data)[1]


# ---- the warm server, which outlives the command that started it ------------------------

WARM_SECONDS = 300.0  # how long the warm server waits for the next grader by default
# What the server's imports can depend on in its environment: a server started under other
# values of these is another server.
KEY_VARIABLES = (
    "PATH", "PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "OPENBLAS", "PYTORCH", "TORCH", "CUDA",
    "NCCL", "GLOO", "NVIDIA", "DPLAB", "MPL",
)  # fmt: skip


PER_CHILD = ("DPLAB_FIGURE_DIR",)  # set anew in each child's environment


def warm_seconds() -> float:
    """Return how long the warm server outlives its last grader: `GRADER_WARM_SECONDS`, by
    default WARM_SECONDS; 0 (or less) starts no warm server: each command has its own."""
    try:
        return float(settings.WARM_SECONDS.get() or WARM_SECONDS)
    except ValueError:
        return WARM_SECONDS


def warm_folder() -> Path | None:
    """Return the folder of this user's warm servers (`GRADER_WARM_DIR`, else a folder of
    the temporary one), made if missing; None unless only this user can enter it."""
    folder = warm_folders()[0]
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = os.lstat(folder)
    except OSError:
        return None
    mine = found.st_uid == os.getuid() and not found.st_mode & 0o077
    return folder if mine and os.path.isdir(folder) and not os.path.islink(folder) else None


def warm_key(env: dict[str, str]) -> str:
    """Return what names a warm server: the Python, the user, the fence asked for, the
    grader's and the lab's code (each file's size and time), torch and matplotlib as
    installed and the environment that imports can depend on. Changing any of them starts
    another server."""
    asked = settings.FENCE.get()
    digest = hashlib.sha256(f"{sys.executable}\n{sys.version}\n{os.geteuid()}\n{asked}".encode())
    kept = {k: v for k, v in env.items() if k.startswith(KEY_VARIABLES) and k not in PER_CHILD}
    digest.update(json.dumps(kept, sort_keys=True).encode())
    roots = [Path(__file__).resolve().parents[2]]  # grader/
    for name in ("dplab", "labtext", "torch", "matplotlib"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).parent)
    for root in roots:
        files = [root / "version.py", root / "__init__.py"] if "-packages" in str(root) else []
        if not files:
            files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".toml"))
        for path in files:
            with contextlib.suppress(OSError):
                found = path.stat()
                digest.update(f"{path}:{found.st_size}:{found.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


class WarmPlace(NamedTuple):
    """Where this user's warm server for this code listens, and its log and environment."""

    path: Path
    log: Path
    env: dict[str, str]
    idle: float


def warm_place() -> WarmPlace | None:
    """Return where the warm server listens, or None where there is to be none (see
    `warm_seconds`, `warm_folder`)."""
    idle = warm_seconds()
    folder = warm_folder() if idle > 0 else None
    if folder is None:
        return None
    # (its matplotlib folder is outside: the children's fence masks the socket's folder)
    env = server_environment(folder.with_name(f"{folder.name}-cache"))
    key = warm_key(env)
    path = folder / f"{key}.sock"
    if len(os.fsencode(path)) > 100:  # the limit of a Unix socket's path (108 bytes)
        return None
    return WarmPlace(path, folder / f"{key}.log", env, idle)


_started: dict[Path, subprocess.Popen] = {}  # the warm servers this process has started


def start_warm(place: WarmPlace) -> subprocess.Popen:
    """Start the warm server at `place`, unless this process has started it already; return
    its process."""
    if place.path not in _started:
        with open(place.log, "ab") as out:
            _started[place.path] = subprocess.Popen(
                [
                    sys.executable, "-m", "grader.front.warm_commands", "--warm", str(place.path),
                    settings.FENCE.get(), f"{place.idle:g}",
                ],
                env=place.env, cwd=place.path.parent, stdin=subprocess.DEVNULL, stdout=out,
                stderr=out, start_new_session=True,
            )  # fmt: skip
    return _started[place.path]


def connect_warm(session: bool = True, wait: bool = True) -> tuple[socket.socket, Path] | None:
    """Return a connection to this user's warm server (started if none answers) and its log,
    or None where there is to be none (see `warm_place`), or, without `wait`, where it had to
    be started. With `session`, the connection is a fork server's session; without, the
    caller says what it wants."""
    place = warm_place()
    if place is None:
        return None
    connection = _connect(place.path)
    if connection is None:
        server = start_warm(place)
        if not wait:
            return None
        # It listens before it imports. One that has ended will not listen: a server that
        # cannot start (its log says why) costs nothing, then or on any later call.
        deadline = time.monotonic() + 30.0
        while connection is None and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
            connection = _connect(place.path)
    if connection is not None and session:
        try:
            socket.send_fds(connection, [b'{"session": true}'], [])
        except OSError:
            connection.close()
            connection = None
    return None if connection is None else (connection, place.log)


def warm_servers(folder: Path) -> list[int]:
    """Return the process ids of the warm servers whose socket is in `folder` (their
    sessions and commands, forked from them, are not counted: they have another parent)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                parent = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"--warm" in argv and argv.index(b"--warm") + 1 < len(argv):
            path = Path(os.fsdecode(argv[argv.index(b"--warm") + 1]))
            forked = parent > 1 and b"--warm" in _cmdline(parent)
            if path.parent == folder and not forked:
                found.append(int(entry))
    return found


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def stop_warm(folder: Path) -> list[int]:
    """Stop the warm servers whose socket is in `folder` (a session, or a command, still
    running ends with its grader); return their process ids."""
    stopped = []
    for pid in warm_servers(folder):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
    return stopped


def _connect(path: Path) -> socket.socket | None:
    """Return a connection to the server listening at `path`, if one of this user's does."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(str(path))
        if peer_uid(connection) == os.getuid():
            return connection
    except OSError:
        pass
    connection.close()
    return None
