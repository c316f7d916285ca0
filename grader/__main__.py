"""`python -m grader`: see grader.cli."""

from grader.cli import main

raise SystemExit(main())
