"""Every limit grading runs under, in one place: what a grading child, a case and a group of
ranks may use before the grader stops them. Each is an option of `python -m grader grade`
(docs/settings.md). Limits stop loops and waits, not slow correct code: processor time,
which a busy machine does not inflate, and idleness; wall time is only a backstop.

The one limit not here is the rank watch's early deadlock window
(dplab.rank_watch.QUIET_SECONDS, 0.6 s stretched on a loaded machine): it belongs to the
students' runtime, which `d2l.launch` uses outside the grader too, and a group it finds
deadlocked would otherwise meet `group_idle_seconds` a few seconds later."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one grading child, its cases and their groups of ranks may use (0: no limit)."""

    check_seconds: float = 60.0  # processor time of one case, per thread
    exercise_seconds: float = 900.0  # wall time of one exercise, loading included: a backstop
    memory_gib: float = 4.0  # data memory of the child
    idle_seconds: float = 30.0  # a case that computes nothing for this long is stopped
    # Ranks that together compute next to nothing this long are deadlocked; never longer
    # than `idle_seconds`, after which the child waiting on them would be stopped anyway.
    group_idle_seconds: float = 5.0
    group_seconds: float = 300.0  # wall time of one group of ranks: a backstop

    def hard_cpu_seconds(self, threads: int) -> float:
        """Return the processor time, all `threads` together, past which the grader kills a
        child that ignored the stop of its case (0: never): half as much again as the case
        may use, and 10 s for the stop to be seen."""
        return self.check_seconds * threads * 1.5 + 10 if self.check_seconds else 0.0

    def of_groups(self, count: int) -> dict[str, float | None]:
        """Return what each of the `count` groups of one case may use, as `d2l.launch`'s
        arguments: the case's processor time shared among them, and the group limits."""
        idle = self.group_idle_seconds
        if self.idle_seconds:
            idle = min(idle, self.idle_seconds) if idle else self.idle_seconds
        return {
            "timeout": self.group_seconds or None,
            "idle_timeout": idle,
            "cpu_limit": self.check_seconds / count if self.check_seconds else None,
        }


# Each limit's option of `grade` and `check` (grader.front.cli), and what it says: every limit
# is settable, and docs/settings.md lists the same (tests/test_settings.py).
OPTIONS = {
    "check_seconds": (
        "--check-timeout",
        "processor time one check may use, in seconds per thread; a busy machine does not "
        "count against it; 0 for none",
    ),
    "idle_seconds": (
        "--idle-timeout",
        "stop a check that computes nothing for this long, in seconds (time.sleep, input()), "
        "and its ranks by then at the latest; 0 for never",
    ),
    "exercise_seconds": (
        "--timeout",
        "wall-time limit of one exercise, in seconds: a backstop, never reached by code that "
        "computes at a normal pace",
    ),
    "memory_gib": ("--memory", "memory limit of a grading process, in GiB; 0 for none"),
    "group_idle_seconds": (
        "--group-idle-timeout",
        "call a group of ranks deadlocked once its ranks together compute next to nothing for "
        "this long, in seconds (at most --idle-timeout); 0: --idle-timeout alone",
    ),
    "group_seconds": (
        "--group-timeout",
        "wall-time limit of one group of ranks, in seconds: a backstop; 0 for none",
    ),
}
