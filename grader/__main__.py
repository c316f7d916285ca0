"""`python -m grader`: see grader.cli."""

import os
import sys

from grader import settings, warm
from grader.sandbox import forkserver

if sys.argv[1:2] in (["check"], ["grade"]) and settings.START.get() != "spawn":
    # The command runs in a session of the warm fork server, which has imported torch and
    # the checks already (see grader.warm), where one answers.
    code = warm.run_warm(sys.argv)
    if code is not None:
        os._exit(code)
    # Else it runs here: the fork server (started if need be) imports torch while this
    # process does the same, on another core.
    forkserver.start()

from grader.cli import main  # noqa: E402

code = main()
forkserver.stop()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # every file is written and closed: unloading torch would only cost a second
