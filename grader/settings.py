"""The grader's settings, read from the environment: every variable the grader reads is here
(its `GRADER_*` settings and XDG_RUNTIME_DIR), with its default and what it does
(docs/settings.md lists them, with the runtime's own in dplab.settings and the language's in
labtext.settings). It imports no torch, so that a command that reads one is not slowed before
the warm server answers."""

from labtext.settings import Setting

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
FAST = Setting(
    "GRADER_FAST",
    "on",
    "off: grade by the plain path alone, as a check on the fast one (the same verdicts, more "
    "time): children started afresh, no warm server, no helper children, no extra child while "
    "cores sit idle",
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

ALL = (
    SOLUTIONS,
    SEED,
    START,
    FAST,
    FENCE,
    WARM_DIR,
    WARM_SECONDS,
    RUNTIME_DIR,
)
