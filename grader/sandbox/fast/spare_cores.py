"""How idle this process's cores have been (`SpareCores`): where they sit idle, the fast
path starts one more notebook's child, or one more submission (`room_while_idle` in
sharing.py, lent through grader.sandbox.speedups)."""

import os
import threading
import time

SPARE_SHARE = 0.75  # of a core, idle on average since the last look: room for one more
LOOK_SECONDS = 0.5


class SpareCores:
    """How idle this process's cores have been since the last look (/proc/stat). Graders
    start one more notebook's child, or one more submission, while they sit idle, so that
    the cores they were given stay busy while a child only waits (ranks watched for a
    deadlock verdict, say). Other users' work on the same cores counts as busy: a shared
    machine gets no extra load. One is shared by the whole process (see spare_cores)."""

    def __init__(self) -> None:
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self.lines = {f"cpu{c}" for c in cores}
        self.lock = threading.Lock()
        self.last = self.read()

    def read(self) -> tuple[float, float] | None:
        """Return (now, seconds these cores have been idle in all), or None where unknown."""
        try:
            with open("/proc/stat") as f:
                rows = [line.split() for line in f if line.startswith("cpu")]
        except OSError:
            return None
        idle = sum(int(r[4]) + int(r[5]) for r in rows if r[0] in self.lines)  # idle, iowait
        return time.monotonic(), idle / os.sysconf("SC_CLK_TCK")

    def idle(self, share: float = SPARE_SHARE) -> bool:
        """Return True if, since the last look at least LOOK_SECONDS ago, `share` of a core
        was idle on average; such a look starts the count anew (so one more at a time)."""
        with self.lock:
            now = self.read()
            if now is None or self.last is None:
                return False
            if now[0] - self.last[0] < LOOK_SECONDS:
                return False
            spare = (now[1] - self.last[1]) / (now[0] - self.last[0])
            self.last = now
            return spare >= share


_spare: list[SpareCores] = []
_spare_lock = threading.Lock()


def spare_cores() -> SpareCores:
    """Return this process's SpareCores."""
    with _spare_lock:
        if not _spare:
            _spare.append(SpareCores())
        return _spare[0]
