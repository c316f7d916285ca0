"""What the fast path may lend the plain sandbox, through this one interface: a way to start
children (a fork server that has imported torch once) and a scheduling policy (helper
children that take a notebook's cases from the far end, and extra children while cores sit
idle: fast/spare_cores.py). The pipeline passes one in (grader.pace); the plain sandbox
asks nothing else of the fast path and imports none of it. `PLAIN` lends nothing: each
child starts afresh, one loop of children per notebook, and the verdicts are the same
(tests/test_fast_path.py)."""

from typing import Protocol


class ChildForker(Protocol):
    """A started fork server, ready (grader.sandbox.fast.forkserver.ForkServer)."""

    fence: object  # the fence its children enter (grader.sandbox.fence.Fence)

    def fork(self, order: object, report_fd: int, reply_fd: int, log_fd: int) -> object:
        """Fork a child for `order` (a grader.base.protocol.ForkOrder); raise OSError if
        the server has gone."""
        ...


class Speedups(Protocol):
    def fork_server(self) -> ChildForker | None:
        """Return the fork server, ready; None where children start afresh."""
        ...

    def more_children(self) -> bool:
        """Whether a notebook may get helper children."""
        ...

    def a_core_is_idle(self) -> bool:
        """Whether a core has sat idle enough since the last look for one more child."""
        ...

    def start_early(self) -> None:
        """Start what `fork_server` will need, before the command imports torch."""
        ...

    def stop(self) -> None:
        """End this process's use of what it started."""
        ...


class Plain:
    """The plain path: nothing lent."""

    def fork_server(self) -> None:
        return None

    def more_children(self) -> bool:
        return False

    def a_core_is_idle(self) -> bool:
        return False

    def start_early(self) -> None:
        pass

    def stop(self) -> None:
        pass


PLAIN = Plain()
