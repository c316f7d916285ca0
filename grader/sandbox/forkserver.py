"""A warm parent for grading children: Python, torch and the public grader imported once.

Starting Python and importing torch takes seconds; a grade needs one child per notebook of a
(and another after each crash). The fork server pays that once: it imports torch, dplab, the
child's code and every public checks module (and, for the children whose cases start process
groups, torch._dynamo and matplotlib: see `the_rest`), then forks a child per request.
Each child is as fresh as a started one where it matters:

- its own session, its own scratch folder, its own environment and working directory;
- the same fence as a started child: it enters its own network and mount namespaces, masks
  the private folders, takes a user id of its own (as root) and drops every capability
  (`grader.sandbox.fence.enter`), then arms the audit hook before any student code;
- the same limits (memory, file size, no core dump), set on itself before the fence;
- only its two pipes and its log stay open: every other descriptor of the server is closed.

The server never imports a hidden check, a mistake or a reference solution (a child would
inherit them), never forks while a thread of its own runs, and never touches CUDA, which a
forked child could not use afterwards. So the grader uses it only where no CUDA device is
visible, and starts each child afresh elsewhere (`GRADER_START=spawn` asks for that
everywhere).

Protocol, on a SOCK_SEQPACKET socket: the server says `ready` (with whether a probe child
could enter the fence) once it has imported what every child needs; each request is one JSON
message with four descriptors (report pipe, reply pipe, log, status pipe), and says whether
the child is to start with everything imported (`complete`: see `serve`). On the status
pipe the server writes the child's pid, and its exit code (as `Popen.returncode`) once it
has ended. When the grader closes the socket, the server kills its children and ends.

The warm server (`serve_warm`) outlives the command that started it, for `GRADER_WARM_SECONDS`
(300 by default; 0 for none) after its last grader. It listens on a Unix socket in a folder
only its user may enter (`GRADER_WARM_DIR`, by default grader-warm-UID in the temporary
folder), named by a digest of what its imports depend on (`warm_key`: the grader's and the
lab's files, torch as installed, the environment), and serves only its own user. For each
grader that connects it forks a session: a fork server as above, or, for `python -m grader
check` and `grade` (`run_warm`), the command itself, run with the grader's standard streams,
folder, environment and arguments, which then asks for a session of its own for the children.
So a later command starts with torch, the lab and the public checks imported. The command
that finds no server answering starts one and runs in its own process: it imports what it
needs on one core while the server imports on another, and asks it for the children once it
is ready. It never runs a command where a GPU may be visible (its children would then start
afresh anyway). It leaves when its files change, and a changed file starts another.
"""

import atexit
import contextlib
import faulthandler
import gc
import hashlib
import importlib.util
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
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

from grader.sandbox.fence import (
    CHILD_UIDS,
    Fence,
    FenceError,
    can_read,
    child_limits,
    enter,
    needed_paths,
    warm_folders,
)

_STATUS = struct.Struct(">i")


# ---- the server --------------------------------------------------------------------------


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """Import without the cyclic garbage collector, then freeze what was imported.

    Importing torch and the rest makes some 600,000 objects; the collector ran over them
    again and again as they came, a fifth of the time the imports took (0.5 s of 2.7 s).
    Frozen, they are never looked at again, here or in a forked child or rank: a child's
    collections go only over what it made itself, and do not write to (and so copy) the pages
    it shares with the server. What the imports left as garbage (a few thousand objects)
    stays frozen too; collecting it first would cost 0.2 s."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def preload() -> None:
    """Import what every child needs, so that a child starts with it already there.
    (Not torchvision: 1.3 s to import, and only reading the real Fashion-MNIST needs it.)"""
    with uncollected():
        _preload()


def _preload() -> None:
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
    dplab.data.embedded_sample()  # decoded once: notebooks load it, and the checks
    dplab.distributed.look_up_backend_plugins()  # once for every process group of every child


def the_rest() -> list[Callable[[], None]]:
    """Return the steps that import what only some children need, last first: once the
    server is ready, it takes them one at a time while it has nothing to do (a grader that
    comes meanwhile waits for one step, not for all), or all before it forks a child that
    asks for everything (see `serve`)."""

    def dynamo() -> None:
        with uncollected():
            import torch._dynamo  # noqa: F401  (every torch.optim optimizer imports it: 0.45 s)

    def plotting() -> None:
        with uncollected():  # (0.2 s: a notebook that imports pyplot imports it whole)
            import matplotlib

            matplotlib.use("Agg")

    return [dynamo, plotting]


def pyplot() -> None:
    """Import pyplot, for the children of later sessions: the warm server takes this step
    while it waits. A child forked without it imports pyplot when first used, as most never
    draw (grader.load.notebook); a session forks complete children without waiting for it."""
    with uncollected():
        import matplotlib.pyplot  # (0.2 s, and it builds the font cache once)

        # Each rank switches pyplot to Agg at each run (dplab.distributed): the first switch
        # imports the backend (8 ms), in every rank of every grade but for this.
        matplotlib.pyplot.switch_backend("Agg")


HUGE_PAGE = 2 << 20


def huge_pages(seconds: float = 0.02) -> Callable[[], bool]:
    """Return a step that asks Linux to back this process's larger writable anonymous
    regions (as they are at the first step) with 2 MiB pages (transparent huge pages,
    MADV_COLLAPSE), 8 MiB at a time for about `seconds`; each step returns True once all is
    asked for. A fork copies a page table entry per page: after `import torch` some 400 MB of
    such memory makes each fork and exit of a child or a rank cost 19 ms of processor time,
    and 7 ms once collapsed. Does nothing where the system cannot (another OS, an older
    kernel, huge pages off)."""
    left: list[tuple[int, int]] | None = None
    madvise = None

    def regions() -> list[tuple[int, int]]:
        if not sys.platform.startswith("linux"):
            return []
        try:
            with open("/proc/self/maps") as f:
                maps = [line.split() for line in f]
        except OSError:
            return []
        found = []
        for fields in maps:
            if "w" not in fields[1] or (len(fields) > 5 and fields[5] != "[heap]"):
                continue  # only the heap and unnamed private memory
            low, high = (int(x, 16) for x in fields[0].split("-"))
            low, high = -(-low // HUGE_PAGE) * HUGE_PAGE, high // HUGE_PAGE * HUGE_PAGE
            found += [(a, min(high, a + 4 * HUGE_PAGE)) for a in range(low, high, 4 * HUGE_PAGE)]
        return found

    def step() -> bool:
        import ctypes

        nonlocal left, madvise
        if left is None:
            try:
                madvise = ctypes.CDLL(None, use_errno=True).madvise
                left = regions()
            except (OSError, AttributeError):
                left = []
        hugepage, collapse = 14, 25  # MADV_HUGEPAGE, MADV_COLLAPSE
        until = time.monotonic() + seconds
        while left and time.monotonic() < until:
            low, high = left.pop()
            if madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), hugepage) == 0:
                madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), collapse)
        return not left

    return step


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
        enter(
            Fence(**request["fence"]),
            request["uid"],
            [Path(p) for p in request["private"]],
            Path(request["tmp"]) if request.get("tmp") else None,
            float(request["memory_gib"]),
        )
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


HOLD_SECONDS = 0.03  # how long a held request waits for others asked for at the same time
# A session imports the rest unasked only once the grader has been quiet this long: a grader
# prepares its requests for a moment after the session says it is ready, and a request that
# came while the session imported waited for that step (torch._dynamo, 0.45 s).
QUIET_SECONDS = 0.25


def serve(
    control: socket.socket,
    fence: Fence,
    fenced: bool | None = None,
    rest: list[Callable[[], object]] | None = None,
) -> None:
    """Answer fork requests on `control` until the grader closes it. It imports what every
    child needs, says it is ready, then imports the rest (`the_rest`) while it
    waits: at once when a request asks for a `complete` child (one whose cases start process
    groups: it and its ranks would otherwise import it themselves), else when it has nothing
    to do. Requests that came with that one and ask for no more are forked first, so that
    they run while it imports (the grader asks for a submission's notebooks at once). A
    session of the warm server (see `serve_warm`) has imported what it has (`rest` is what
    it has not) and knows whether children can enter the fence (`fenced`)."""
    later = list(rest or [])
    if fenced is None:
        preload()
        later = the_rest()
        fenced = probe_fence(fence)
    control.send(json.dumps({"ready": True, "fence": fenced, "chosen": asdict(fence)}).encode())
    children: dict[int, int] = {}  # pid -> status descriptor

    def fork(request: dict, fds: list[int]) -> None:
        pid = os.fork()
        if pid == 0:
            control.close()
            become_child(request, fds)
        for fd in fds[:3]:
            os.close(fd)
        children[pid] = fds[3]
        _write_status(fds[3], pid)

    def receive() -> tuple[dict, list[int]] | None:
        """Read one request; None once the grader has gone, no descriptors for a malformed
        one (those it came with are closed)."""
        message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
        if not message:
            return None
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            return {}, []
        return json.loads(message), fds

    def fork_complete(first: tuple[dict, list[int]]) -> bool:
        """Import the rest, then fork `first`; fork at once the requests that come with it
        and need no more. Return False if the grader has gone meanwhile."""
        held = [first]
        while select.select([control], [], [], HOLD_SECONDS)[0]:
            more = receive()
            if more is None:  # nobody waits for the held children
                for fd in (fd for _, fds in held for fd in fds):
                    os.close(fd)
                return False
            if more[1] and more[0].get("complete"):
                held.append(more)
            elif more[1]:
                fork(*more)
        while later:
            later.pop()()
        for request, fds in held:
            fork(request, fds)
        return True

    heard = time.monotonic()  # when the grader last asked (or was told it may)
    try:
        while True:
            ready, _, _ = select.select([control], [], [], 0.02)
            if not ready and later and not children and time.monotonic() - heard > QUIET_SECONDS:
                later.pop()()
            elif ready:
                heard = time.monotonic()
                got = receive()
                if got is None:
                    break  # the grader has gone
                if got[1] and later and got[0].get("complete"):
                    if not fork_complete(got):
                        break
                elif got[1]:
                    fork(*got)
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


def peer_uid(connection: socket.socket) -> int:
    """Return the user id of the process at the other end of a Unix socket."""
    pid_uid_gid = struct.Struct("3i")
    data = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, pid_uid_gid.size)
    return pid_uid_gid.unpack(data)[1]


def serve_warm(
    listener: socket.socket,
    path: str,
    chosen: Callable[[], Fence],
    idle: float,
    started_in: dict[str, str],
) -> None:
    """The warm server: import once, then fork a session (`serve`, on its own connection) for
    each grader that connects, until no grader has come or been served for `idle` seconds, or
    until its code is no longer the grader's (`warm_key` has changed: a file was edited).
    Only a process of this server's own user is served. `chosen()` returns the fence (being
    chosen while this imports)."""
    key = Path(path).stem
    looked = time.monotonic()
    preload()
    # Done while it waits, last thing first, a step at a time (each returns whether it is
    # done): the rest of the imports (a session forked before has them to do: see `serve`),
    # pyplot, then huge pages for what it has imported by then, so that later sessions fork
    # cheaper children (0.6 to 0.9 s in all, 20 ms at a time).
    rest = the_rest()
    later = [huge_pages(), pyplot, *rest]
    fence = chosen()
    fenced = probe_fence(fence)
    sessions: set[int] = set()
    last = time.monotonic()
    try:
        while sessions or time.monotonic() - last < idle:
            ready, _, _ = select.select([listener], [], [], 0.05 if later else 1.0)
            while sessions:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                sessions.discard(pid)
                last = time.monotonic()
            if not ready:
                if later and not sessions:
                    if later[-1]() is not False:  # done: every later session has it
                        later.pop()
                elif not sessions and time.monotonic() - looked > 2.0:
                    looked = time.monotonic()
                    if warm_key(started_in) != key:
                        break  # stale: the next grader starts a server with the new code
                continue
            connection, _ = listener.accept()
            if peer_uid(connection) != os.getuid():
                connection.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                try:
                    message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
                    asked = json.loads(message) if message else {}
                    if "command" in asked and len(fds) == 3:
                        run_command(connection, asked, fds)
                    else:
                        left = [step for step in later if step in rest]
                        serve(connection, fence, fenced=fenced, rest=left)
                finally:
                    os._exit(0)
            connection.close()
            sessions.add(pid)
            last = time.monotonic()
    finally:
        with contextlib.suppress(OSError):  # the path may lead to a newer server by now
            if os.stat(path).st_ino == os.fstat(listener.fileno()).st_ino:
                os.remove(path)


def run_command(connection: socket.socket, asked: dict, fds: list[int]) -> None:
    """In a session of the warm server: become `python -m grader COMMAND...` as the grader
    that asked would have been (its standard streams, folder, environment and arguments),
    run it, and send its exit code. Torch, the lab and the public checks are already here;
    the rest is imported now, as it would be there."""
    code = 1
    try:
        for fd, target in zip(fds, (0, 1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        connection.send(json.dumps({"pid": os.getpid()}).encode())
        threading.Thread(target=_end_with, args=(connection,), daemon=True).start()
        os.chdir(asked["cwd"])
        os.environ.clear()
        os.environ.update(asked["env"])
        tempfile.tempdir = None
        sys.argv = list(asked["command"])
        sys.path[0] = asked["cwd"]
        for number, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            stream = open(number, "r" if number == 0 else "w", closefd=False)  # noqa: SIM115
            if number and os.isatty(number):
                stream.reconfigure(line_buffering=True)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        from grader.cli import main as cli

        try:
            code = cli(sys.argv[1:])
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
        except KeyboardInterrupt:
            code = 130
        stop()
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            connection.send(json.dumps({"code": code}).encode())
        os._exit(code)


def _gpu_device_here() -> bool:
    """Return True if this machine has NVIDIA or AMD GPU devices (looked up without torch)."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


def _end_with(connection: socket.socket) -> None:
    """Wait for the grader that asked for this command to go (nothing else ever comes on its
    connection), then end this process: killed, the grader would have ended it too."""
    with contextlib.suppress(OSError):
        connection.recv(1)
    os.kill(os.getpid(), signal.SIGKILL)


def run_warm(argv: list[str]) -> int | None:
    """Run `python -m grader ARGV...` in a session of this user's warm server and return its
    exit code; None where the command is to run in this process: where there is to be no
    warm server, where a GPU may be visible, and where none answers yet. Then it is started
    here, and while it imports, this process imports what the command needs on another core
    and runs it, asking the server for its children once it is ready. The command's output
    goes where this process's would, and Ctrl-C reaches it."""
    if os.environ.get("GRADER_START") != "fork" and _gpu_device_here():
        return None
    found = connect_warm(session=False, wait=False)
    if found is None:
        return None
    connection, _ = found
    command = json.dumps({"command": argv, "cwd": os.getcwd(), "env": dict(os.environ)})
    try:
        socket.send_fds(connection, [command.encode()], [0, 1, 2])
    except OSError:
        return None
    pid = None
    while True:
        try:
            message = connection.recv(1 << 16)
        except KeyboardInterrupt:
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGINT)
            continue
        except OSError:
            message = b""
        said = json.loads(message) if message else {}
        if "pid" in said:
            pid = int(said["pid"])
            continue
        if "code" in said:
            return int(said["code"])
        if pid is None:
            return None  # it never started: run here instead
        print("the grader's process ended without an exit code", file=sys.stderr)
        return 1


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader stops the children on Ctrl-C
    if sys.argv[1] == "--warm":
        path, asked_fence, idle = sys.argv[2], sys.argv[3], sys.argv[4]
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        own = f"{path}.{os.getpid()}"  # bound, then put in place whole
        listener.bind(own)
        listener.listen(16)
        os.replace(own, path)
        environment = dict(os.environ)  # as started: importing torch adds to it
        from grader.sandbox.fence import choose_fence

        if asked_fence:
            os.environ["GRADER_FENCE"] = asked_fence
        # Chosen once here, and known to every command run here. Its probes (a Python started
        # behind each fence tried, 0.3 s) wait on processes of their own: a thread waits for
        # them while this one imports, and has ended before anything is forked.
        chosen: list = []

        def choose() -> None:
            try:
                chosen.append(choose_fence())
            except BaseException as error:  # raised again where the fence is needed
                chosen.append(error)

        chooser = threading.Thread(target=choose)
        chooser.start()

        def fence() -> Fence:
            chooser.join()
            if isinstance(chosen[0], BaseException):
                raise chosen[0]
            return chosen[0]

        serve_warm(listener, path, fence, float(idle), environment)
        os._exit(0)
    control = socket.socket(fileno=int(sys.argv[1]))
    fence = Fence(**json.loads(sys.argv[2]))
    serve(control, fence)
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
    """The grader's handle on one fork server; `fork` starts a fenced child. Started for this
    process alone, or (`attached`) a session of the warm server on a connected socket."""

    def __init__(
        self,
        fence: Fence,
        env: dict[str, str],
        log: Path,
        attached: socket.socket | None = None,
    ) -> None:
        self.fence = fence
        self._lock = threading.Lock()  # one request at a time on the socket
        self._ready_lock = threading.Lock()  # one reader of the ready message
        self.ready = False
        self.fence_works = False
        self.log = log
        self.warm = attached is not None
        self._process: subprocess.Popen | None = None
        if attached is not None:
            self._socket = attached
            return
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log, "ab") as out:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "grader.sandbox.forkserver",
                    str(theirs.fileno()),
                    json.dumps(asdict(fence)),
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
            if isinstance(said.get("chosen"), dict):  # the fence the server chose for itself
                self.fence = Fence(**said["chosen"])
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
        if self._process is None:  # a session: alive until it fails to fork (see start_child)
            return self._socket.fileno() >= 0
        return self._process.poll() is None

    def close(self, wait: bool = True) -> None:
        """End the server (it kills any child still running when it sees the socket close)."""
        if self._socket.fileno() < 0:
            return
        self._socket.close()
        if not wait or self._process is None:
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
    """End this process's use of the shared fork server, if it has one, without waiting: a
    server of its own ends; the warm server's session for it ends, and the server stays."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close(wait=False)
            if not _shared.warm:
                shutil.rmtree(_shared.log.parent, ignore_errors=True)
            _shared = None


def start() -> ForkServer:
    """Start the shared fork server if none runs (it imports in the background) and return
    it: a session of the warm server where one is allowed (`connect_warm`), else a server of
    this process's own. Cheap to call early: this process imports no torch for it."""
    global _shared
    from grader.sandbox.fence import choose_fence

    with _shared_lock:
        if _shared is None or not _shared.alive():
            warm = connect_warm()
            if warm is not None:  # its fence is the one the server chose (see wait_ready)
                connection, log = warm
                _shared = ForkServer(Fence("", False, ""), {}, log, connection)
                atexit.register(_shared.close)
                return _shared
            fence = choose_fence()
            folder = Path(tempfile.mkdtemp(prefix="grader-forkserver-"))
            _shared = ForkServer(fence, server_environment(folder), folder / "log")
            atexit.register(shutil.rmtree, folder, True)
            atexit.register(_shared.close)
        return _shared


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
        return float(os.environ.get("GRADER_WARM_SECONDS", WARM_SECONDS))
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
    asked = os.environ.get("GRADER_FENCE", "")
    digest = hashlib.sha256(f"{sys.executable}\n{sys.version}\n{os.geteuid()}\n{asked}".encode())
    kept = {k: v for k, v in env.items() if k.startswith(KEY_VARIABLES) and k not in PER_CHILD}
    digest.update(json.dumps(kept, sort_keys=True).encode())
    roots = [Path(__file__).resolve().parents[1]]  # grader/
    for name in ("dplab", "torch", "matplotlib"):
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


_started: set[Path] = set()  # the warm servers this process has started


def start_warm(place: WarmPlace) -> None:
    """Start the warm server at `place`, unless this process has started it already."""
    if place.path in _started:
        return
    _started.add(place.path)
    with open(place.log, "ab") as out:
        subprocess.Popen(
            [
                sys.executable, "-m", "grader.sandbox.forkserver", "--warm", str(place.path),
                os.environ.get("GRADER_FENCE", ""), f"{place.idle:g}",
            ],
            env=place.env, cwd=place.path.parent, stdin=subprocess.DEVNULL, stdout=out,
            stderr=out, start_new_session=True,
        )  # fmt: skip


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
        start_warm(place)
        if not wait:
            return None
        deadline = time.monotonic() + 30.0  # it listens before it imports
        while connection is None and time.monotonic() < deadline:
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


def ready_server() -> ForkServer | None:
    """Return the shared fork server once it is ready, or None if it cannot fence children."""
    server = start()
    return server if server.wait_ready() else None


if __name__ == "__main__":
    main()
