"""How fast this run grades: the fast path's speedups (grader.sandbox.fast), or the plain
path alone where `GRADER_FAST=off`, in which case the fast path is never imported. The
pipeline and the front ends ask here, and pass what they get to the sandbox. It imports no
torch, so that a command reaches the warm server first."""

from grader import settings
from grader.sandbox.speedups import PLAIN, Speedups


def fast_path_on() -> bool:
    """Whether the fast path may be taken (GRADER_FAST, read here alone)."""
    return settings.FAST.get().strip().lower() != "off"


def chosen() -> Speedups:
    """Return what the fast path lends the sandbox, or `PLAIN`."""
    if not fast_path_on():
        return PLAIN
    from grader.sandbox.fast import FAST

    return FAST


def warm_server_allowed() -> bool:
    """Whether a command may run in (and start) the warm server: the fast path's, which
    forks; not where children are asked to start afresh."""
    return fast_path_on() and settings.START.get().strip().lower() != "spawn"
