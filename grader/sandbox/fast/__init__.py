"""The fast path, beside the plain sandbox: what only makes grading quicker. The plain
sandbox reaches it through the functions below alone; inside, the fork server (forkserver.py)
and the client of the warm server (warm_client.py). Imports the plain sandbox and below.
`GRADER_FAST=off` turns it all off, and every verdict stays the same (tests/test_fast_path.py).
"""

from grader import settings


def enabled() -> bool:
    """Whether the fast path may be taken (GRADER_FAST, read here alone): the fork server,
    the warm server, helper children and extra children on idle cores."""
    return settings.FAST.get().strip().lower() != "off"


def start_mode() -> str:
    """Return how children start: "fork" (from the fork server) or "spawn" (a new Python
    each, the plain path's way). `GRADER_START` chooses; by default, fork unless a CUDA
    device is visible. Without the fast path, always spawn."""
    asked = settings.START.get().strip().lower()
    if not enabled():
        return "spawn"
    if asked in ("fork", "spawn"):
        return asked
    import torch

    return "spawn" if torch.cuda.device_count() > 0 else "fork"


def fork_server():
    """Return the fork server, ready (a grader.sandbox.fast.forkserver.ForkServer); None where
    children start afresh (see `start_mode`) or the server cannot fence its children."""
    if start_mode() != "fork":
        return None
    from grader.sandbox.fast import forkserver

    return forkserver.ready_server()


def more_children() -> bool:
    """Whether a notebook may get more than one child: helpers that take its cases from the
    far end, and an extra child while the cores sit idle (grader.sandbox.scheduler)."""
    return enabled()
