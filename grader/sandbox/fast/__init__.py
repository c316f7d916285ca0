"""The fast path, beside the plain sandbox: what only makes grading quicker, lent to it as
grader.sandbox.speedups declares (`FAST`, passed in by grader.pace): the fork server and its
preload, helper loops and idle cores (sharing.py), and the warm server. Imports the plain
sandbox and below; nothing imports it where `GRADER_FAST=off` (tests/test_fast_path.py).
"""

from grader import settings


def start_mode() -> str:
    """Return how children start: "fork" (from the fork server) or "spawn" (a new Python
    each, the plain path's way). `GRADER_START` chooses; by default, fork unless a CUDA
    device is visible."""
    asked = settings.START.get().strip().lower()
    if asked in ("fork", "spawn"):
        return asked
    import torch

    return "spawn" if torch.cuda.device_count() > 0 else "fork"


class Fast:
    """What the fast path lends (see grader.sandbox.speedups.Speedups)."""

    def fork_server(self):
        """Return the fork server, ready (a grader.sandbox.fast.forkserver.ForkServer); None
        where children start afresh (see `start_mode`) or it cannot fence its children."""
        if start_mode() != "fork":
            return None
        from grader.sandbox.fast import forkserver

        return forkserver.ready_server()

    def loops(self, cases, last):
        """Helper loops beside each notebook's first (see sharing.SharedLoops)."""
        from grader.sandbox.fast.sharing import SharedLoops

        return SharedLoops(cases, last)

    def room(self, least, most):
        """One more while a core sits idle (see sharing.room_while_idle)."""
        from grader.sandbox.fast.sharing import room_while_idle

        return room_while_idle(least, most)

    def start_early(self) -> None:
        """Start the fork server now: it imports torch while the command does the same, on
        another core. (Not asked whether children fork: that would import torch here.)"""
        from grader.sandbox.fast import forkserver

        forkserver.start()

    def run_warm(self, asked: dict) -> int | None:
        from grader.sandbox.fast.warm_server import run_in_warm_server

        return run_in_warm_server(asked)

    def serve_warm(self, argv, run_command) -> None:
        from grader.sandbox.fast.warm_server import start_serving

        start_serving(argv, run_command)

    def stop(self) -> None:
        """End this process's use of the fork server."""
        from grader.sandbox.fast import forkserver

        forkserver.stop()


FAST = Fast()
