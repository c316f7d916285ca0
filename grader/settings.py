"""The grader's settings, read from the environment: every variable the grader reads is here
(its `GRADER_*` settings, and those that choose the language of the lab's messages, which
grader.i18n reads for dplab too), with its default and what it does (docs/settings.md lists
them, with the runtime's own in dplab.settings). It imports nothing of the lab, so that
grader.i18n, at the bottom of the layers, can read it."""

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

RUNTIME_DIR = Setting(
    "XDG_RUNTIME_DIR",
    "",
    "set by the login session: the folder where the warm servers listen by default (else the "
    "temporary folder)",
)

# The language of messages (grader.i18n): --lang, else the notebook's, else these, in turn.
SESSION = Setting(
    "JPY_SESSION_NAME",
    "",
    "set by Jupyter in a kernel: the notebook it runs, whose language the kernel's messages take",
)
LANGUAGE = Setting(
    "LAB_LANG",
    "",
    "the language of messages where neither --lang nor the notebook names one: zh_CN (Chinese) "
    "or en; start-lab and the hub pass it on to the kernels",
)
LC_ALL = Setting("LC_ALL", "", "the locale, where LAB_LANG is unset: Chinese for zh*, else English")
LC_MESSAGES = Setting("LC_MESSAGES", "", "the locale of messages, where LC_ALL is unset")
LANG = Setting("LANG", "", "the locale, where LC_ALL and LC_MESSAGES are unset")
LOCALE = (LC_ALL, LC_MESSAGES, LANG)  # in the order they are read

ALL = (
    SOLUTIONS,
    SEED,
    START,
    FENCE,
    WARM_DIR,
    WARM_SECONDS,
    RUNTIME_DIR,
    SESSION,
    LANGUAGE,
    *LOCALE,
)
