"""`python -m grader`: see grader.front.cli."""

import os
import sys


def _standard_streams_open() -> None:
    """Open the null device on any of the standard streams that was closed (`>&-`): else the
    first file or socket opened takes its number, and output meant for the terminal goes
    there. The reports are written all the same."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


_standard_streams_open()

from grader import pace  # noqa: E402

if sys.argv[1:2] in (["check"], ["grade"]) and pace.warm_server_allowed():
    # The command runs in a session of the warm fork server, which has imported torch and
    # the checks already (see grader.front.warm_commands), where one answers.
    from grader.front import warm_commands

    code = warm_commands.run_warm(sys.argv)
    if code is not None:
        os._exit(code)
    # Else it runs here: the fork server (started if need be) imports torch while this
    # process does the same, on another core.
    pace.chosen().start_early()

from grader.base.printed import ReaderGone  # noqa: E402
from grader.front.cli import main  # noqa: E402

sys.stdout = ReaderGone(sys.stdout)
code = main()
pace.chosen().stop()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # every file is written and closed: unloading torch would only cost a second
