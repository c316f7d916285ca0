"""`python -m grader.front.warm_commands --warm SOCKET FENCE IDLE`: the warm server, the fast
path's (grader.sandbox.fast.warm_server), and what it runs in each session a command asks for
(`run_command`): the command line itself, as the grader that asked would have run it. Reached
through grader.pace alone."""

import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import traceback

from grader import pace
from grader.base.printed import ReaderGone
from grader.report.paths import umask


def run_command(connection: socket.socket, asked: dict, fds: list[int]) -> None:
    """In a session of the warm server: become `python -m grader COMMAND...` as the grader
    that asked would have been (its standard streams, folder, environment and arguments),
    run it, and send its exit code. Torch, the lab and the public checks are already here;
    the rest is imported now, as it would be there. So its report paths mean what they mean
    to the grader: `-` and `/dev/stdout` its standard output, a relative one in its folder."""
    code = 1
    try:
        for fd, target in zip(fds, (0, 1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        connection.send(json.dumps({"pid": os.getpid()}).encode())
        threading.Thread(target=_end_with, args=(connection,), daemon=True).start()
        os.chdir(asked["cwd"])  # relative paths are the grader's
        if "umask" in asked:  # the files it makes get the grader's modes
            os.umask(int(asked["umask"]))
        os.environ.clear()
        os.environ.update(asked["env"])
        tempfile.tempdir = None
        sys.argv = list(asked["command"])
        sys.path[0] = asked["cwd"]
        for number, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            stream = open(number, "r" if number == 0 else "w", closefd=False)  # noqa: SIM115
            if number and os.isatty(number):
                stream.reconfigure(line_buffering=True)
            setattr(sys, f"__{name}__", stream)
            setattr(sys, name, ReaderGone(stream) if number == 1 else stream)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        from grader.front.cli import main as cli

        try:
            code = cli(sys.argv[1:])
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
        except KeyboardInterrupt:
            code = 130
        pace.chosen().stop()
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            connection.send(json.dumps({"code": code}).encode())
        os._exit(code)


def _end_with(connection: socket.socket) -> None:
    """Wait for the grader that asked for this command to go (nothing else ever comes on its
    connection), then end this process: killed, the grader would have ended it too."""
    with contextlib.suppress(OSError):
        connection.recv(1)
    os.kill(os.getpid(), signal.SIGKILL)


def run_warm(argv: list[str]) -> int | None:
    """Run `python -m grader ARGV...` in a session of this user's warm server, as this process
    would have (its folder, environment and umask); return its exit code, or None where it is
    to run here (see grader.sandbox.fast.warm_server.run_in_warm_server)."""
    asked = {"command": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask()}
    return pace.chosen().run_warm(asked)


def main() -> None:
    """Serve as the warm server (see grader.sandbox.fast.warm_client.start_warm)."""
    pace.chosen().serve_warm(sys.argv, run_command)
    os._exit(0)


if __name__ == "__main__":
    main()
