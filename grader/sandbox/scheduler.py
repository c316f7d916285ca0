"""Who runs next: which loop of children takes each case of a notebook (`Shares`), and how
many notebooks or submissions run side by side (more while the cores sit idle, where the
fast path says they do: grader.sandbox.fast.spare_cores)."""

import contextvars
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from grader.api import Case
from grader.sandbox.collected import Collected

LOOK_SECONDS = 0.5  # how often to look again for room while items wait


class Shares:
    """Which loop of children has taken each case of one notebook's exercises.

    A notebook's cases run one after another in a loop of children (`run_notebook`): a child
    takes (claims) each case just before it runs it. Once every notebook has started, a core
    left free (its notebook done, or the others waiting on deadlocked ranks) goes to a helper:
    another loop on the same notebook, which takes the last case nobody has taken and works
    back from there, while the first loop works forward. Each case runs in the loop that took
    it first, and in that loop only (restarted there after a crash, as without helpers).

    A helper takes the exercises in `last` after the others. Those are exercises whose cases
    hold names right with the reference's in ranks shared by the notebook's cases: their ranks
    stop at the exercise's end (grader.ranks.pools.reference_in_ranks), so a helper that began with
    one would fork its ranks twice, while a loop that ends with it forks them once."""

    def __init__(self, cases: dict[str, list[Case]], last: frozenset[str] = frozenset()) -> None:
        # exercise id -> its case names, both in the notebook's order; and each case by both
        self.cases = {ex: [c.name for c in found] for ex, found in cases.items()}
        self.case = {(ex, c.name): c for ex, found in cases.items() for c in found}
        self.last = last
        self.owner: dict[tuple[str, str], object] = {}  # (exercise, case) -> the loop
        self.lock = threading.Lock()

    def backwards(self, order: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
        """Return a helper's order of the exercises and cases in `order`: from the last case
        back, those of the exercises in `last` after the others."""
        found = [(ex, names[::-1]) for ex, names in reversed(order.items())]
        return sorted(found, key=lambda item: item[0] in self.last)  # (a stable sort)

    def take(self, exercise: str, case: str, loop: object) -> bool:
        """Give a case to `loop` unless another loop has it; return True if it is loop's."""
        with self.lock:
            return self.owner.setdefault((exercise, case), loop) is loop

    def open(self, loop: object, collected: Collected) -> dict[str, list[str]]:
        """Return the cases left to run that are the loop's or nobody's, by exercise (those
        with any), in order; None as `loop`: the cases nobody has taken."""
        with self.lock:
            found = {}
            for exercise, names in self.cases.items():
                if exercise in collected.stopped:
                    continue
                ran = collected.outcomes.get(exercise, {})
                left = [
                    name
                    for name in names
                    if name not in ran and self.owner.get((exercise, name), loop) is loop
                ]
                if left:
                    found[exercise] = left
            return found

    def untaken(self, collected: Collected) -> dict[str, list[str]]:
        """Return the cases nobody has taken, as `open` does; none before the notebook's
        first loop has taken one (a helper would only race it)."""
        return self.open(None, collected) if self.owner else {}

    def helper(self, collected: Collected) -> object | None:
        """Return a new loop that has taken the last case nobody has taken, or None if there
        is none (see `untaken`)."""
        free = self.untaken(collected)
        if not free:
            return None
        exercise, names = self.backwards(free)[0]
        loop = object()
        return loop if self.take(exercise, names[0], loop) else None


def side_by_side_while_idle(
    fn: Callable[[Any], Any],
    items: list,
    least: int | Callable[[], int],
    most: int,
    extra: tuple[Callable[[], bool], Callable[[], Any]] | None = None,
    a_core_is_idle: Callable[[], bool] = lambda: False,
) -> Iterator[tuple[Future, int]]:
    """Run `fn(item)` for each item in threads of their own, in order: `least` at a time (a
    number, or a function that says it now), and one more whenever `a_core_is_idle()` (the
    fast path's), up to `most`. Once every item has
    started, `extra = (wanted, make)` asks for more: while `wanted()` and there is room as
    above, `make()` returns one more item (or None). Yield each call's future as it
    finishes, with how many are still running. Closing the iterator (Ctrl-C) starts no more
    and does not wait for those running: the caller stops their children. Each call runs in
    a copy of the caller's context, so it speaks the caller's language (labtext.speaking)."""
    at_least = least if callable(least) else lambda: least
    most = max(1, at_least(), most)
    pool = ThreadPoolExecutor(most)
    waiting, running = deque(items), set()

    def room() -> bool:
        fewest = min(most, max(1, at_least()))
        return len(running) < fewest or (len(running) < most and a_core_is_idle())

    try:
        while waiting or running:
            while waiting and room():
                running.add(pool.submit(contextvars.copy_context().run, fn, waiting.popleft()))
            if not waiting and running and extra is not None and extra[0]() and room():
                item = extra[1]()
                if item is not None:
                    running.add(pool.submit(contextvars.copy_context().run, fn, item))
            timeout = LOOK_SECONDS if waiting or extra is not None else None
            finished, running = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
            for done in finished:
                yield done, len(running)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
