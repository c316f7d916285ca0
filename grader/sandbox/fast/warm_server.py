"""The fast path's warm server: a fork server that outlives the command that started it, and
runs whole `python -m grader check` and `grade` commands, warm (grader.front.warm_commands
runs them in its sessions).

The warm server (`serve_warm`) outlives the command that started it, for
`GRADER_WARM_SECONDS` (300 by default; 0 for none) after its last grader. It listens on a
Unix socket in a folder only its user may enter (`GRADER_WARM_DIR`, by default
grader-warm-UID in the temporary folder), named by a digest of what its imports depend on
(`warm_key`: the grader's and the lab's files, torch as installed, the environment), and
serves only its own user. For each grader that connects it forks a session: a fork server as
above, or, for `python -m grader check` and `grade` (`run_in_warm_server`), the command
itself, run with the grader's standard streams, folder, environment and arguments, which
then asks for a session of its own for the children. So a later command starts with torch,
the lab and the public checks imported. The command that finds no server answering starts
one and runs in its own process: it imports what it needs on one core while the server
imports on another, and asks it for the children once it is ready. It never runs a command
where a GPU may be visible (its children would then start afresh anyway). It leaves when its
files change, and a changed file starts another.
"""

import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from grader import settings
from grader.sandbox.fast.forkserver import probe_fence, serve
from grader.sandbox.fast.preload import huge_pages, preload, pyplot, the_rest
from grader.sandbox.fast.warm_client import connect_warm, peer_uid, warm_key
from grader.sandbox.fence import Fence
from labtext import _

# Runs a command asked for on a connection, in a session (grader.front.warm_commands.run_command).
RunCommand = Callable[[socket.socket, dict, list[int]], None]


def serve_warm(
    listener: socket.socket,
    path: str,
    chosen: Callable[[], Fence],
    idle: float,
    started_in: dict[str, str],
    run_command: RunCommand,
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
            if _reaped(sessions):
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
            sessions.add(
                _fork_session(listener, connection, fence, fenced, later, rest, run_command)
            )
            last = time.monotonic()
    finally:
        with contextlib.suppress(OSError):  # the path may lead to a newer server by now
            if os.stat(path).st_ino == os.fstat(listener.fileno()).st_ino:
                os.remove(path)


def _reaped(sessions: set[int]) -> bool:
    """Collect the sessions that have ended, without waiting; return True if any had."""
    ended = False
    while sessions:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        sessions.discard(pid)
        ended = True
    return ended


def _fork_session(
    listener: socket.socket,
    connection: socket.socket,
    fence: Fence,
    fenced: bool,
    later: list[Callable[[], object]],
    rest: list[Callable[[], object]],
    run_command: RunCommand,
) -> int:
    """Fork a session for the grader on `connection` and return its pid. The session runs
    the command it asks for (`run_command`: grader.front.warm_commands's), or else serves it
    as a fork server, with the imports of `rest` the server has not done yet (those still
    in `later`) to do first."""
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
    return pid


def _gpu_device_here() -> bool:
    """Return True if this machine has NVIDIA or AMD GPU devices (looked up without torch)."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


def run_in_warm_server(asked: dict) -> int | None:
    """Run the command `asked` (its "command", "cwd", "env" and "umask": see
    grader.front.warm_commands.run_warm) in a session of this user's warm server and return
    its exit code; None where the command is to run in this process: where a GPU may be
    visible, and where no server answers yet. Then it is started here, and while it imports,
    this process imports what the command needs on another core and runs it, asking the
    server for its children once it is ready. The command's output goes where this
    process's would, and Ctrl-C reaches it."""
    if settings.START.get() != "fork" and _gpu_device_here():
        return None
    found = connect_warm(session=False, wait=False)
    if found is None:
        return None
    connection = found[0]
    command = json.dumps(asked)
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
        print(_("the grader's process ended without an exit code"), file=sys.stderr)
        return 1


def start_serving(argv: list[str], run_command: RunCommand) -> None:
    """Serve as the warm server `python -m grader.front.warm_commands --warm SOCKET FENCE IDLE`
    (`argv`; see warm_client.start_warm), running commands with `run_command`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader stops the children on Ctrl-C
    path, asked_fence, idle = argv[2], argv[3], argv[4]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    own = f"{path}.{os.getpid()}"  # bound, then put in place whole
    listener.bind(own)
    listener.listen(16)
    os.replace(own, path)
    environment = dict(os.environ)  # as started: importing torch adds to it
    from grader.sandbox.fence import choose_fence

    if asked_fence:
        os.environ[settings.FENCE.name] = asked_fence
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

    serve_warm(listener, path, fence, float(idle), environment, run_command)
    os._exit(0)
