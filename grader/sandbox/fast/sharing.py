"""The fast path's scheduling: helper loops of children that take a notebook's cases from
the far end (`Shares`, `SharedLoops`), and one more notebook or submission at a time while
the cores sit idle (`room_while_idle`, measured by spare_cores.py). The plain sandbox asks
for them through grader.sandbox.speedups."""

import threading
from collections.abc import Callable

from grader.api import Case
from grader.sandbox.collected import Collected
from grader.sandbox.fast import spare_cores
from grader.sandbox.scheduler import AtOnce


class Shares:
    """Which loop of children has taken each case of one notebook's exercises.

    A notebook's cases run one after another in a loop of children (`run_loop`): a child
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
        # exercise id -> its case names, both in the notebook's order
        self.cases = {ex: [c.name for c in found] for ex, found in cases.items()}
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


class SharedLoop:
    """A loop of children on a notebook whose cases `shares` gives out: the notebook's first
    loop, or a `helper` that runs from the last case back (grader.sandbox.scheduler.OneLoop
    is the plain path's)."""

    asks = True  # its children claim each case just before they run it

    def __init__(self, shares: Shares, helper: bool) -> None:
        self.shares, self.helper = shares, helper

    def left(self, collected: Collected) -> list[tuple[str, list[str]]]:
        todo = self.shares.open(self, collected)
        return self.shares.backwards(todo) if self.helper else list(todo.items())

    def take(self, exercise: str, case: str) -> bool:
        return self.shares.take(exercise, case, self)

    def holds_any(self, exercise: str, names: list[str]) -> bool:
        """Whether the loop has taken one of the exercise's cases `names` (the first loop
        answers for all that nobody has)."""
        owner = self.shares.owner.get
        return not self.helper or any(owner((exercise, n)) is self for n in names)


class SharedLoops:
    """The loops of children on each notebook of a submission: its first loop, then helpers
    while cases are left that nobody has taken (`more`)."""

    def __init__(self, cases: dict[str, dict[str, list[Case]]], last: dict[str, frozenset[str]]):
        self.shares = {nb: Shares(found, last.get(nb, frozenset())) for nb, found in cases.items()}
        self.collected: Collected | None = None

    def first(self, notebook: str, collected: Collected) -> SharedLoop:
        self.collected = collected
        return SharedLoop(self.shares[notebook], helper=False)

    def untaken(self, notebook: str) -> int:
        return sum(map(len, self.shares[notebook].untaken(self.collected).values()))

    def wanted(self) -> bool:
        return self.collected is not None and any(map(self.untaken, self.shares))

    def helper(self) -> tuple[str, SharedLoop] | None:
        """Return a notebook and a new helper loop on it that has taken the last case nobody
        has taken (of the notebook with most such cases), or None."""
        for notebook in sorted(self.shares, key=self.untaken, reverse=True):
            shares = self.shares[notebook]
            free = shares.untaken(self.collected)
            if not free:
                continue
            exercise, names = shares.backwards(free)[0]
            loop = SharedLoop(shares, helper=True)
            if shares.take(exercise, names[0], loop):
                return notebook, loop
        return None

    @property
    def more(self) -> tuple[Callable[[], bool], Callable[[], object]]:
        return self.wanted, self.helper


def room_while_idle(least: AtOnce, most: int) -> Callable[[int], bool]:
    """Return the fast path's room: `least.now` at a time, and one more whenever a core has
    sat idle long enough, up to `most`."""

    def room(running: int) -> bool:
        fewest = min(most, max(1, least.now))
        return running < fewest or (running < most and spare_cores.spare_cores().idle())

    return room
