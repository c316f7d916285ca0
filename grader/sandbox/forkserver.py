"""A warm parent for grading children: Python, torch and the public grader imported once.

Starting Python and importing torch takes seconds; a grade needs one child per notebook of a
(and another after each crash). The fork server pays that once: it imports torch, dplab,
matplotlib, the child's code and every public checks module, then forks a child per request.
Each child is as fresh as a started one where it matters:

- its own session, its own scratch folder, its own environment and working directory;
- the same fence as a started child: it enters its own network and mount namespaces, masks
  the private folders, takes a user id of its own (as root) and drops every capability
  (`grader.sandbox.fence.enter`), then arms the audit hook before any student code;
- the same limits (memory, file size, no core dump), set on itself before the fence;
- only its two pipes and its log stay open: every other descriptor of the server is closed.

The server never imports a hidden check, a mistake or a reference solution (a child would
inherit them), never starts a thread, and never touches CUDA, which a forked child could not
use afterwards. So the grader uses it only where no CUDA device is visible, and starts each
child afresh elsewhere (`GRADER_START=spawn` asks for that everywhere).

Protocol, on a SOCK_SEQPACKET socket: the server says `ready` (with whether a probe child
could enter the fence); each request is one JSON message with four descriptors (report pipe,
reply pipe, log, status pipe). On the status pipe the server writes the child's pid, and its
exit code (as `Popen.returncode`) once it has ended. When the grader closes the socket, the
server kills its children and ends.
"""

import atexit
import faulthandler
import json
import os
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from dataclasses import asdict
from pathlib import Path

from grader.sandbox.fence import (
    CHILD_UIDS,
    Fence,
    FenceError,
    can_read,
    child_limits,
    enter,
    needed_paths,
)

_STATUS = struct.Struct(">i")


# ---- the server --------------------------------------------------------------------------


def preload() -> None:
    """Import what every child needs, so that a child starts with it already there.
    (Not torchvision: 1.3 s to import, and only reading the real Fashion-MNIST needs it.)"""
    import matplotlib

    matplotlib.use("Agg")
    import torch  # noqa: F401

    # A tensor subclass's first operation imports this (0.7 s): the lab's stand-in devices.
    import torch.distributed.tensor  # noqa: F401

    import dplab.data
    import dplab.distributed
    import grader.fixtures  # noqa: F401
    import grader.sandbox.child  # noqa: F401
    from grader.manifest import load_manifest

    for ex in load_manifest().exercises:
        __import__(ex.checks)
    dplab.data.embedded_sample()  # decoded once (0.4 s): notebooks load it, and the checks
    dplab.distributed.look_up_backend_plugins()  # once for every process group of every child


def preload_when_idle() -> None:
    """Import what only some children need, once the server is ready and has nothing to do:
    the first children import it themselves, later ones find it here."""
    import matplotlib.pyplot  # noqa: F401  (0.4 s, and it builds the font cache once)
    import torch._dynamo  # noqa: F401  (every torch.optim optimizer imports it: 1.2 s)


def _close_other_descriptors(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def become_child(request: dict, fds: list[int]) -> None:
    """In a freshly forked process: close, limit and fence it, then run the child; exits."""
    code = 1
    try:
        os.setsid()
        report_fd, reply_fd, log_fd, _status = fds
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        _close_other_descriptors({report_fd, reply_fd})
        # The signal handlers a freshly started Python has (the server ignores Ctrl-C).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        faulthandler.enable(file=sys.stderr)
        for kind, value in child_limits(float(request["memory_gib"])).items():
            resource.setrlimit(kind, (value, value))
        enter(Fence(**request["fence"]), request["uid"], [Path(p) for p in request["private"]])
        scratch = request["scratch"]
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None
        sys.path[0] = scratch
        sys.dont_write_bytecode = True
        sys.argv = [str(Path(__file__).with_name("child.py")), request["request"]]
        from grader.sandbox import child

        child.main(request["request"], report_fd=report_fd, reply_fd=reply_fd)
        code = 0
    except FenceError as error:
        print(f"the grading child could not enter its fence: {error}", file=sys.stderr)
        code = 3
    except SystemExit as error:
        code = error.code if isinstance(error.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def probe_fence(fence: Fence) -> bool:
    """Return True if a forked child can enter `fence` (as the last of the children's uids)."""
    pid = os.fork()
    if pid == 0:
        try:
            uid = CHILD_UIDS[-1] if fence.own_uid else None
            enter(fence, uid, [])
            os._exit(0 if can_read(needed_paths()) else 1)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def serve(control: socket.socket, fence: Fence, everything: bool = True) -> None:
    """Answer fork requests on `control` until the grader closes it. With `everything`, it
    imports all it may need before it is ready (a grade); without, only what every child
    needs, and the rest while it waits (a student's check of one exercise)."""
    preload()
    later = [] if everything else [preload_when_idle]
    if everything:
        preload_when_idle()
    control.send(json.dumps({"ready": True, "fence": probe_fence(fence)}).encode())
    children: dict[int, int] = {}  # pid -> status descriptor
    try:
        while True:
            ready, _, _ = select.select([control], [], [], 0.02)
            if not ready and later and not children:
                later.pop()()
            elif ready:
                message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
                if not message:
                    break  # the grader has gone
                if len(fds) != 4:
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    control.close()
                    become_child(json.loads(message), fds)
                for fd in fds[:3]:
                    os.close(fd)
                children[pid] = fds[3]
                _write_status(fds[3], pid)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                fd = children.pop(pid, None)
                if fd is not None:
                    _write_status(fd, os.waitstatus_to_exitcode(status))
                    os.close(fd)
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def _write_status(fd: int, value: int) -> None:
    try:
        os.write(fd, _STATUS.pack(value))
    except OSError:
        pass  # the grader no longer listens for this child


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    fence = Fence(**json.loads(sys.argv[2]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader stops the children on Ctrl-C
    serve(control, fence, everything=sys.argv[3:4] != ["some"])
    os._exit(0)  # nothing to tidy: unloading torch would only cost a second


# ---- the grader's side -------------------------------------------------------------------


class ForkedChild:
    """A child forked by the server, watched as a `subprocess.Popen` would be."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid, self._status_fd, self.returncode = pid, status_fd, None

    def _read_code(self, block: bool) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not block and not select.select([self._status_fd], [], [], 0)[0]:
            return None
        data = os.read(self._status_fd, _STATUS.size)
        os.close(self._status_fd)
        # No status: the server died with the child unreaped; it was killed with it.
        self.returncode = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else -9
        return self.returncode

    def poll(self) -> int | None:
        return self._read_code(block=False)

    def wait(self) -> int:
        return self._read_code(block=True)  # type: ignore[return-value]


class ForkServer:
    """The grader's handle on one fork server; `fork` starts a fenced child."""

    def __init__(
        self, fence: Fence, env: dict[str, str], log: Path, everything: bool = True
    ) -> None:
        self.fence = fence
        self._lock = threading.Lock()  # one request at a time on the socket
        self._ready_lock = threading.Lock()  # one reader of the ready message
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log, "ab") as out:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "grader.sandbox.forkserver",
                    str(theirs.fileno()),
                    json.dumps(asdict(fence)),
                    "all" if everything else "some",
                ],
                env=env,
                cwd=tempfile.gettempdir(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        theirs.close()
        self.ready = False
        self.fence_works = False
        self.log = log

    def wait_ready(self, timeout: float = 300.0) -> bool:
        """Wait for the server's imports; return True if it forks fenced children."""
        with self._ready_lock:
            return self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> bool:
        if not self.ready:
            ready, _, _ = select.select([self._socket], [], [], timeout)
            message = self._socket.recv(1 << 16) if ready else b""
            try:
                said = json.loads(message) if message else {}
            except ValueError:
                said = {}
            self.ready = bool(said.get("ready"))
            self.fence_works = bool(said.get("fence"))
        return self.ready and self.fence_works

    def fork(self, request: dict, report_fd: int, reply_fd: int, log_fd: int) -> ForkedChild:
        """Fork a child for `request`; the descriptors are the child's ends of its pipes."""
        status_read, status_write = os.pipe()
        try:
            with self._lock:
                socket.send_fds(
                    self._socket,
                    [json.dumps(request).encode()],
                    [report_fd, reply_fd, log_fd, status_write],
                )
        finally:
            os.close(status_write)
        data = os.read(status_read, _STATUS.size)
        if len(data) != _STATUS.size:
            os.close(status_read)
            raise OSError("the fork server did not start a grading child")
        return ForkedChild(_STATUS.unpack(data)[0], status_read)

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self, wait: bool = True) -> None:
        """End the server (it kills any child still running when it sees the socket close)."""
        if self._socket.fileno() < 0:
            return
        self._socket.close()
        if not wait:
            return
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


# PyTorch's OpenMP threads spin while they wait for each other. On a machine whose cores are
# busy with other work, that spinning made one grade take 74 s instead of 9 s (2 cores, one
# of them kept busy). Children use one thread (grader.grading.default_threads); this keeps
# code that asks for more from spinning.
WAIT_POLICY = "PASSIVE"

_shared: ForkServer | None = None
_shared_lock = threading.Lock()


def server_environment(folder: Path) -> dict[str, str]:
    """Return the fork server's environment (each child gets its own in its request)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADER_", "JUPYTER"))}
    env.update(
        MPLBACKEND="Agg",
        MPLCONFIGDIR=str(folder / "matplotlib"),
        DPLAB_OFFLINE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTORCH_NVML_BASED_CUDA_CHECK="1",  # CUDA checks that never initialise CUDA
    )
    env.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    return env


def stop() -> None:
    """End the shared fork server, if one runs, without waiting for it to exit."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close(wait=False)
            shutil.rmtree(_shared.log.parent, ignore_errors=True)
            _shared = None


def start(everything: bool = True) -> ForkServer:
    """Start the shared fork server if none runs (it imports in the background) and return
    it. Cheap to call early: this process imports no torch for it. Without `everything`,
    it is ready sooner and imports what only some children need while it waits."""
    global _shared
    from grader.sandbox.fence import choose_fence

    with _shared_lock:
        if _shared is None or not _shared.alive():
            folder = Path(tempfile.mkdtemp(prefix="grader-forkserver-"))
            _shared = ForkServer(
                choose_fence(), server_environment(folder), folder / "log", everything
            )
            atexit.register(shutil.rmtree, folder, True)
            atexit.register(_shared.close)
        return _shared


def ready_server() -> ForkServer | None:
    """Return the shared fork server once it is ready, or None if it cannot fence children."""
    server = start()
    return server if server.wait_ready() else None


if __name__ == "__main__":
    main()
