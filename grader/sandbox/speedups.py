"""What the fast path may lend the plain sandbox, through this one interface: a way to start
children (a fork server that has imported torch once) and a scheduling policy (helper loops
of children that take a notebook's cases from the far end, and one more child while the
cores sit idle). The pipeline passes one in (grader.pace); the plain sandbox asks nothing
else of the fast path and imports none of it. `PLAIN` lends nothing: each child starts
afresh, one loop of children per notebook, `least` at a time, and the verdicts are the same
(tests/test_fast_path.py)."""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from grader.sandbox.collected import Collected
from grader.sandbox.scheduler import AtOnce, OneLoopEach, at_most

if TYPE_CHECKING:
    from grader.api import Case


class ChildForker(Protocol):
    """A started fork server, ready (grader.sandbox.fast.forkserver.ForkServer)."""

    fence: object  # the fence its children enter (grader.sandbox.fence.Fence)

    def fork(self, order: object, report_fd: int, reply_fd: int, log_fd: int) -> object:
        """Fork a child for `order` (a grader.base.protocol.ForkOrder); raise OSError if
        the server has gone."""
        ...


class Loop(Protocol):
    """A loop of children on a notebook, one child at a time (grader.sandbox.scheduler.OneLoop
    is the plain path's; grader.sandbox.fast.sharing.SharedLoop shares a notebook's cases)."""

    asks: bool  # whether its children ask (claim) before each case
    helper: bool  # a loop beside the notebook's first: it ends if the notebook cannot load

    def left(self, collected: Collected) -> list[tuple[str, list[str]]]:
        """Return the exercises with cases left to this loop, and those cases, in order."""
        ...

    def take(self, exercise: str, case: str) -> bool:
        """Take the case for this loop unless another has it; return True if it is this one's."""
        ...

    def holds_any(self, exercise: str, names: list[str]) -> bool:
        """Whether the exercise's failure to load, with `names` left, is this loop's to report."""
        ...


class Speedups(Protocol):
    def fork_server(self) -> ChildForker | None:
        """Return the fork server, ready; None where children start afresh."""
        ...

    def loops(self, cases: dict[str, dict[str, list["Case"]]], last: dict[str, frozenset[str]]):
        """Return the loops of children for a submission's notebooks (`cases`: notebook ->
        exercise id -> its cases; `last`: by notebook, the exercises a helper takes last): an
        object with `first(notebook, collected)`, the notebook's first loop (see
        grader.sandbox.scheduler.OneLoop for what a loop does), and `more`, None or the
        (wanted, make) of grader.sandbox.scheduler.in_threads that makes helper loops."""
        ...

    def room(self, least: AtOnce, most: int) -> Callable[[int], bool]:
        """Return whether one more may start beside `running` ones: `least.now` at a time, at
        most `most`."""
        ...

    def start_early(self) -> None:
        """Start what `fork_server` will need, before the command imports torch."""
        ...

    def run_warm(self, asked: dict) -> int | None:
        """Run a command in the warm server (grader.front.warm_commands.run_warm); return its
        exit code, or None where it is to run in this process."""
        ...

    def serve_warm(self, argv: list[str], run_command: Callable) -> None:
        """Be the warm server started as `argv`, running commands with `run_command`."""
        ...

    def stop(self) -> None:
        """End this process's use of what it started."""
        ...


class Plain:
    """The plain path: nothing lent."""

    def fork_server(self) -> None:
        return None

    def loops(self, cases: dict[str, dict[str, list["Case"]]], last: Any) -> OneLoopEach:
        return OneLoopEach(
            {
                nb: {ex: [c.name for c in found] for ex, found in by.items()}
                for nb, by in cases.items()
            }
        )

    def room(self, least: AtOnce, most: int) -> Callable[[int], bool]:
        return at_most(least)

    def start_early(self) -> None:
        pass

    def run_warm(self, asked: dict) -> None:
        return None

    def serve_warm(self, argv: list[str], run_command: Callable) -> None:
        raise RuntimeError("the plain path has no warm server (GRADER_FAST=off)")

    def stop(self) -> None:
        pass


PLAIN = Plain()
