"""The grader's settings, read from the environment: every `GRADER_*` variable the grader
reads is here, with its default and what it does (docs/settings.md lists them, with the
runtime's own in dplab.settings)."""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """An environment variable the grader reads, its default, and what it changes (the same
    shape as dplab.settings.Setting, kept here so that reading one imports no torch)."""

    name: str
    default: str
    help: str

    def get(self) -> str:
        """Return the variable's value here, or its default where it is unset."""
        return os.environ.get(self.name, self.default)


SOLUTIONS = Setting(
    "GRADER_SOLUTIONS", "", "the folder of reference notebooks (default: solutions/<assignment>)"
)
SEED = Setting("GRADER_SEED", "0", "the seed of a notebook's check(...) cells")
START = Setting(
    "GRADER_START",
    "auto",
    "how grading children start: fork (from the fork server), spawn (a new Python each), or "
    "auto (fork unless a GPU is visible)",
)
FENCE = Setting(
    "GRADER_FENCE",
    "",
    "none: no operating-system fence around grading children, Python's audit hook alone "
    "(by default, the strongest fence this machine allows)",
)
WARM_DIR = Setting(
    "GRADER_WARM_DIR", "", "the folder of this user's warm servers (default: grader-warm-UID)"
)
WARM_SECONDS = Setting(
    "GRADER_WARM_SECONDS",
    "300",
    "how long the warm server outlives its last command; 0: no warm server",
)

ALL = (SOLUTIONS, SEED, START, FENCE, WARM_DIR, WARM_SECONDS)
