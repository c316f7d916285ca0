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

The warm server (grader.front.warm_commands) is a fork server that outlives its command; finding and
starting it is grader.sandbox.fast.warm_client.
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
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from grader.base.protocol import ORDERS, ForkOrder, from_plain, to_plain
from grader.sandbox.fast.preload import preload, server_environment, the_rest
from grader.sandbox.fast.warm_client import connect_warm
from grader.sandbox.fence import (
    CHILD_UIDS,
    Fence,
    FenceError,
    can_read,
    child_limits,
    ending_with_this_process,
    enter,
    needed_paths,
)
from labtext import _

_STATUS = struct.Struct(">i")


def _close_other_descriptors(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def become_child(order: ForkOrder, fds: list[int], end_with_server: Callable[[], None]) -> None:
    """In a freshly forked process: close, limit and fence it, then run the child; exits.
    It ends with the server that forked it, which the kernel may kill for memory."""
    code = 1
    try:
        end_with_server()
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
        for kind, value in child_limits(order.memory_gib).items():
            resource.setrlimit(kind, (value, value))
        enter(
            Fence(**order.fence),
            order.uid,
            [Path(p) for p in order.private],
            Path(order.tmp) if order.tmp else None,
            order.memory_gib,
        )
        end_with_server()  # again: a user of its own cleared it
        scratch = order.scratch
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update(order.env)
        tempfile.tempdir = None
        sys.path[0] = scratch
        sys.dont_write_bytecode = True
        sys.argv = [str(Path(__file__).parents[1] / "child.py"), order.request]
        from grader.sandbox import child

        child.main(order.request, report_fd=report_fd, reply_fd=reply_fd)
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
    Requests(control, later).answer()


class Requests:
    """The fork requests of one grader on `control`, the children forked for them, and the
    imports still `later` (see `serve`)."""

    def __init__(self, control: socket.socket, later: list[Callable[[], object]]) -> None:
        self.control = control
        self.later = later
        self.children: dict[int, int] = {}  # pid -> status descriptor

    def answer(self) -> None:
        """Answer requests until the grader has gone, then kill the children left."""
        heard = time.monotonic()  # when the grader last asked (or was told it may)
        try:
            while True:
                ready, _, _ = select.select([self.control], [], [], 0.02)
                if (
                    not ready
                    and self.later
                    and not self.children
                    and time.monotonic() - heard > QUIET_SECONDS
                ):
                    self.later.pop()()
                elif ready:
                    heard = time.monotonic()
                    if not self.answer_one():
                        break  # the grader has gone
                self.reap()
        finally:
            for pid in self.children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass

    def answer_one(self) -> bool:
        """Read one request and fork for it; return False if the grader has gone."""
        got = self.receive()
        if got is None:
            return False
        if got[1] and self.later and got[0].complete:
            return self.fork_complete(got)
        if got[1]:
            self.fork(*got)
        return True

    def fork(self, order: ForkOrder, fds: list[int]) -> None:
        """Fork a child for `order` (see become_child), which takes `fds`; tell the grader
        its pid on its status pipe, which the server keeps."""
        end_with_server = ending_with_this_process()
        pid = os.fork()
        if pid == 0:
            self.control.close()
            become_child(order, fds, end_with_server)
        for fd in fds[:3]:
            os.close(fd)
        self.children[pid] = fds[3]
        _write_status(fds[3], pid)

    def receive(self) -> tuple[ForkOrder | None, list[int]] | None:
        """Read one order; None once the grader has gone, no order and no descriptors for a
        malformed one (those it came with are closed)."""
        message, fds, _, _ = socket.recv_fds(self.control, 1 << 20, 4)
        if not message:
            return None
        try:
            order = from_plain(json.loads(message), ORDERS)
        except ValueError:  # (json's errors are ValueErrors too)
            order = None
        if order is None or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            return None, []
        return order, fds

    def fork_complete(self, first: tuple[ForkOrder, list[int]]) -> bool:
        """Import the rest, then fork `first`; fork at once the requests that come with it
        and need no more. Return False if the grader has gone meanwhile."""
        held = [first]
        while select.select([self.control], [], [], HOLD_SECONDS)[0]:
            more = self.receive()
            if more is None:  # nobody waits for the held children
                for fd in (fd for _, fds in held for fd in fds):
                    os.close(fd)
                return False
            if more[1] and more[0].complete:
                held.append(more)
            elif more[1]:
                self.fork(*more)
        while self.later:
            self.later.pop()()
        for order, fds in held:
            self.fork(order, fds)
        return True

    def reap(self) -> None:
        """Write the exit code of each child that has ended on its status pipe."""
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            fd = self.children.pop(pid, None)
            if fd is not None:
                _write_status(fd, os.waitstatus_to_exitcode(status))
                os.close(fd)


def _write_status(fd: int, value: int) -> None:
    try:
        os.write(fd, _STATUS.pack(value))
    except OSError:
        pass  # the grader no longer listens for this child


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader stops the children on Ctrl-C
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
        with open(log, "ab") as out:  # (started by the thread that stays: see _STARTER)
            self._process = _STARTER.submit(
                subprocess.Popen,
                [
                    sys.executable,
                    "-m",
                    "grader.sandbox.fast.forkserver",
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
                preexec_fn=ending_with_this_process(),
            ).result()
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

    def fork(self, order: ForkOrder, report_fd: int, reply_fd: int, log_fd: int) -> ForkedChild:
        """Fork a child for `order`; the descriptors are the child's ends of its pipes."""
        status_read, status_write = os.pipe()
        try:
            with self._lock:
                socket.send_fds(
                    self._socket,
                    [json.dumps(to_plain(order)).encode()],
                    [report_fd, reply_fd, log_fd, status_write],
                )
        finally:
            os.close(status_write)
        data = os.read(status_read, _STATUS.size)
        if len(data) != _STATUS.size:
            os.close(status_read)
            raise OSError(_("the fork server did not start a grading child"))
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


# A server ends with the grader, even one killed for memory (the kernel kills it: see
# ending_with_this_process), and its children end with it. The kernel follows the *thread*
# that started it, so it is started from this one, which lives as long as the grader; a
# server restarted from a thread that grades one submission would end with that thread.
_STARTER = ThreadPoolExecutor(1, thread_name_prefix="fork-server-start")
_shared: ForkServer | None = None
_shared_lock = threading.Lock()


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


def ready_server() -> ForkServer | None:
    """Return the shared fork server once it is ready, or None if it cannot fence children."""
    server = start()
    return server if server.wait_ready() else None


if __name__ == "__main__":
    main()
