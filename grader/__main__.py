"""`python -m grader`: see grader.cli."""

import os
import sys

if sys.argv[1:2] in (["check"], ["grade"]) and os.environ.get("GRADER_START") != "spawn":
    # The fork server imports torch while this process does the same (see grader.sandbox).
    from grader.sandbox import forkserver

    forkserver.start()

from grader.cli import main  # noqa: E402

raise SystemExit(main())
