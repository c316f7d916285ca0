"""The audit hook a grading child arms before any student code runs: no network, no new
process (but the ranks the lab's launcher forks and PyTorch's DataLoader workers), no
reading of private folders and no writing outside the child's own (see grader.sandbox.fence)."""

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from labtext import N_, _

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


def launcher_code() -> object:
    """Return the code of the function allowed to start the ranks of a process group in the
    child: the lab's launcher forking a rank (taken before any student code runs, so a
    replacement of the function, or of its code, is not it)."""
    from dplab import rank

    return rank.fork_rank.__code__


PROCESSES_REFUSED = N_("starting processes is not allowed while grading")
SPAWN_REFUSED = N_(
    "starting processes is not allowed while grading with the spawn or forkserver start "
    "method: a DataLoader may start its workers with the default one (leave its "
    "multiprocessing_context unset), or use num_workers=0"
)


def loader_worker_test() -> Callable[[FrameType], bool]:
    """Return the test of an `os.fork` (given the frame that calls it) that only PyTorch's
    DataLoader starting a worker process passes, from objects taken now, before any student
    code runs: the fork is multiprocessing's own (`popen_fork.Popen._launch`), of a process of
    the standard library's default or fork class whose `run` is `BaseProcess.run`, whose target
    is torch's worker loop with its own code, on behalf of the DataLoader iterator that starts
    its workers. The worker runs the student's Dataset and collate function behind the fence
    it inherits, as a rank does."""
    from multiprocessing import context, popen_fork, process

    from torch.utils.data import dataloader
    from torch.utils.data._utils import worker

    launch = popen_fork.Popen._launch.__code__
    classes = (context.Process, context.ForkProcess)
    run, bootstrap = process.BaseProcess.run, process.BaseProcess._bootstrap
    loop, loop_code = worker._worker_loop, worker._worker_loop.__code__
    starts = dataloader._MultiProcessingDataLoaderIter.__init__.__code__

    def test(frame: FrameType) -> bool:
        if frame.f_code is not launch:
            return False
        started = frame.f_locals.get("process_obj")
        kind = type(started)
        if kind not in classes or kind.run is not run or kind._bootstrap is not bootstrap:
            return False
        own = vars(started)  # (what the worker runs, none of it replaced on the process)
        if own.get("_target") is not loop or loop.__code__ is not loop_code:
            return False
        if "run" in own or "_bootstrap" in own:
            return False
        caller = frame.f_back
        for _step in range(8):  # Popen.__init__, the context's _Popen, Process.start, ...
            if caller is None:
                return False
            if caller.f_code is starts:
                return True
            caller = caller.f_back
        return False

    return test


def _refuse_fork_exec() -> None:
    """Make `_posixsubprocess.fork_exec` refuse. It starts a new program and raises no audit
    event: multiprocessing's spawn and forkserver start methods reach it without passing
    os.fork or subprocess.Popen, and the new Python would run without this child's hooks.
    The replacement keeps no reference to the original; the hook refuses to import the module
    afresh, which would give the original back."""
    import _posixsubprocess

    def fork_exec(*args: object, **kwargs: object) -> None:
        raise Fenced(_(SPAWN_REFUSED))

    _posixsubprocess.fork_exec = fork_exec


def _as_prefixes(roots: list[Path]) -> list[tuple[str, str]]:
    """Return each folder as itself and as the prefix of what is inside it ("/a/b", "/a/b/")."""
    return [(str(r), str(r).rstrip("/") + "/") for r in roots]


def _under(path, roots: list[tuple[str, str]]) -> bool:
    """Return True if `path`, its links followed, is one of `roots` or inside one."""
    try:
        resolved = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError, OSError):
        return False
    return any(resolved == root or resolved.startswith(inside) for root, inside in roots)


def _own_unix_socket(event: str, args: tuple, own_folder: list[tuple[str, str]]) -> bool:
    """Return True for a Unix socket bound or connected to a path in the child's own
    folders, or a message sent on one already connected: it reaches the child's own
    processes alone (a DataLoader's workers hand their tensors over one)."""
    sock, address = (list(args) + [None, None])[:2]
    if getattr(sock, "family", None) != socket.AF_UNIX:
        return False
    if address is None:  # sending on a connected socket (writing to it is not audited)
        return event in ("socket.sendmsg", "socket.sendto")
    return (
        event in ("socket.bind", "socket.connect", "socket.sendmsg", "socket.sendto")
        and isinstance(address, str | bytes)
        and address[:1] not in ("", "\0", b"\0")  # (abstract addresses are not files)
        and _under(address, own_folder)
    )


def _check_open(
    args: tuple, private: list[tuple[str, str]], allowed: list[tuple[str, str]]
) -> None:
    """Refuse an `open` event for a private path, or for writing outside `allowed`."""
    path, mode, flags = (list(args) + [None, 0])[:3]
    if _under(path, private):
        raise Fenced(_("{path} is private to the grader").format(path=os.fsdecode(path)))
    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & _WRITE_FLAGS
    )
    if writing and not _under(path, allowed):
        raise Fenced(
            _("writing {path} is not allowed while grading").format(path=os.fsdecode(path))
        )


def _check_change(args: tuple, allowed: list[tuple[str, str]]) -> None:
    """Refuse an event of _CHANGES whose paths (the first two arguments) are not all allowed."""
    for path in args[:2]:
        if isinstance(path, str | bytes | os.PathLike) and not _under(path, allowed):
            raise Fenced(
                _("changing {path} is not allowed while grading").format(path=os.fsdecode(path))
            )


def install_audit_hook(scratch: Path, private: list[Path]) -> None:
    """Refuse network use, new processes, reading private folders and writing elsewhere (but
    let the lab's launcher fork the ranks of a process group, and PyTorch's DataLoader its
    worker processes: see the module docstring)."""
    allowed = _as_prefixes([scratch.resolve(), Path("/dev")])
    own_folder = _as_prefixes([scratch.resolve()])  # (not /dev: /dev/log is the system's)
    private = _as_prefixes(private)
    fork_rank = launcher_code()
    starts_a_loader_worker = loader_worker_test()
    _refuse_fork_exec()

    def hook(event: str, args: tuple) -> None:
        if event in _NETWORK:
            if _own_unix_socket(event, args, own_folder):
                return
            raise Fenced(_("network use is not allowed while grading"))
        if event in _PROCESSES:
            if event == "os.fork":
                # (here, not in a helper: frame 1 is the code that forks)
                caller = sys._getframe(1)
                if caller.f_code is fork_rank or starts_a_loader_worker(caller):
                    return
            raise Fenced(_(PROCESSES_REFUSED))
        if event == "import" and args and args[0] == "_posixsubprocess":
            if "_posixsubprocess" not in sys.modules:  # afresh: the original fork_exec
                raise Fenced(_(SPAWN_REFUSED))
        if event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
            _check_open(args, private, allowed)
        elif event in _CHANGES and args and isinstance(args[0], str | bytes | os.PathLike):
            _check_change(args, allowed)

    sys.addaudithook(hook)
