"""Who runs next: the cases left to a notebook's loop of children (`OneLoop`, the plain
path's: one loop per notebook), and calls run in threads a few at a time (`in_threads`).
How many, and any loops beside the first, are the speedups' to say (grader.sandbox.speedups)."""

import contextvars
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from grader.sandbox.collected import Collected

LOOK_SECONDS = 0.5  # how often to look again for room while items wait


@dataclass
class AtOnce:
    """How many of a submission's notebooks are graded at a time. A class run sets `now` as
    its submissions end (fewer left, more cores each); the sandbox reads it whenever it looks
    for room, and never calls back into the class run to ask."""

    now: int = 1


class OneLoop:
    """The only loop of children on a notebook: it runs every case of `cases` (exercise id ->
    its case names, in order) that has not run, of the exercises not stopped."""

    asks = False  # its children never ask before a case: no other loop could have it
    helper = False

    def __init__(self, cases: dict[str, list[str]]) -> None:
        self.cases = cases

    def left(self, collected: Collected) -> list[tuple[str, list[str]]]:
        """Return the exercises with cases left to run, and those cases, in order."""
        found = []
        for exercise, names in self.cases.items():
            ran = collected.outcomes.get(exercise, {})
            left = [name for name in names if name not in ran]
            if left and exercise not in collected.stopped:
                found.append((exercise, left))
        return found

    def take(self, exercise: str, case: str) -> bool:
        return True

    def holds_any(self, exercise: str, names: list[str]) -> bool:
        return True


class OneLoopEach:
    """The plain path's loops: one per notebook (`cases`: notebook -> exercise id -> its case
    names), and no more."""

    more = None  # (see in_threads)

    def __init__(self, cases: dict[str, dict[str, list[str]]]) -> None:
        self.cases = cases

    def first(self, notebook: str, collected: Collected) -> OneLoop:
        return OneLoop(self.cases[notebook])


def in_threads(
    fn: Callable[[Any], Any],
    items: list,
    room: Callable[[int], bool],
    most: int,
    more: tuple[Callable[[], bool], Callable[[], Any]] | None = None,
) -> Iterator[tuple[Future, int]]:
    """Run `fn(item)` for each item in threads of their own, in order, while `room(running)`
    says one more may start, `most` at a time at most. Once every item has started, `more =
    (wanted, make)` asks for more: while `wanted()` and there is room, `make()` returns one
    more item (or None). Yield each call's future as it finishes, with how many are still
    running. Closing the iterator (Ctrl-C) starts no more and does not wait for those
    running: the caller stops their children. Each call runs in a copy of the caller's
    context, so it speaks the caller's language (labtext.speaking)."""
    pool = ThreadPoolExecutor(max(1, most))
    waiting, running = deque(items), set()

    def start(item: Any) -> None:
        running.add(pool.submit(contextvars.copy_context().run, fn, item))

    try:
        while waiting or running:
            while waiting and (not running or room(len(running))):
                start(waiting.popleft())
            if not waiting and running and more is not None and more[0]() and room(len(running)):
                item = more[1]()
                if item is not None:
                    start(item)
            timeout = LOOK_SECONDS if waiting or more is not None else None
            finished, running = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
            for done in finished:
                yield done, len(running)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def at_most(least: AtOnce) -> Callable[[int], bool]:
    """Return the plain room: `least.now` at a time."""
    return lambda running: running < max(1, least.now)
