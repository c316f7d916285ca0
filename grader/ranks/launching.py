"""Run several process groups side by side, each a case's group of one size, and stop the
larger ones once a smaller one has failed."""

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from dplab.distributed import check_arguments, launch_folder, pause, read_results, start_group
from dplab.launched import GroupNotFormed, Launched, LaunchError, RankFailed
from dplab.rank_watch import Group, watch_group
from labtext import _


class GroupStopped(LaunchError):
    """A group stopped before its end because a group before it in the same call had failed
    (see `launch_each`'s `stop_after_failure`)."""


def not_formed(outcome: "Launched | LaunchError") -> bool:
    """Return True for a run whose ranks failed to form their group (see GroupNotFormed)."""
    return isinstance(outcome, RankFailed) and outcome.raised == GroupNotFormed.__name__


def launch_each(
    calls: list[tuple[Callable, int]],
    backend: str | None = None,
    timeout: float = 3600.0,
    idle_timeout: float = 60.0,
    cpu_limit: float | None = None,
    stop_after_failure: bool = False,
) -> list[Launched | LaunchError]:
    """Run several groups side by side: for each (fn, nprocs) in `calls`, `fn()` in every
    process of a group of its own, as `launch` does (quietly). Return, in order, what each
    launch returned, or the LaunchError that ended it: one group's failure ends no other,
    unless `stop_after_failure`: then it stops the groups after it in `calls` that are still
    running (their outcome is a GroupStopped), for a caller that reads the outcomes in order
    up to the first failure. Groups that mostly wait (the checks' tiny cases) take little
    longer together than the largest alone."""

    def begin(fn: Callable, nprocs: int, chosen: str, folder: Path, store_timeout: float):
        return start_group(fn, (), None, nprocs, chosen, folder, store_timeout, False)

    return run_groups(calls, backend, timeout, idle_timeout, cpu_limit, begin, stop_after_failure)


def run_groups(
    calls: list[tuple[Callable, int]],
    backend: str | None,
    timeout: float,
    idle_timeout: float,
    cpu_limit: float | None,
    begin: Callable[..., "Group"],
    stop_after_failure: bool = False,
) -> list[Launched | LaunchError]:
    """Run each (fn, nprocs) of `calls` in a group of its own, side by side, and watch them all
    (see `launch_each`, and its `stop_after_failure`). `begin(fn, nprocs, backend, folder,
    store_timeout)` starts one group's run in `folder` and returns the parent's view of it."""
    chosen = [check_arguments(fn, (), nprocs, backend) for fn, nprocs in calls]
    started = time.monotonic()
    store_timeout = max(2 * idle_timeout, 30.0) if idle_timeout else timeout
    outcomes: list[Launched | LaunchError | None] = [None] * len(calls)
    with contextlib.ExitStack() as stack:
        groups: list[Group] = []
        watchers = {}
        try:
            for i, ((fn, nprocs), backend_i) in enumerate(zip(calls, chosen, strict=True)):
                folder = stack.enter_context(launch_folder())
                groups.append(begin(fn, nprocs, backend_i, folder, store_timeout))
                watchers[i] = watch_group(groups[i], nprocs, timeout, idle_timeout, cpu_limit)
            while watchers:
                for i, watcher in list(watchers.items()):
                    if i not in watchers:  # stopped meanwhile
                        continue
                    try:
                        next(watcher)
                    except StopIteration:
                        outcomes[i] = read_results(groups[i], chosen[i], started)
                        del watchers[i]
                    except LaunchError as error:
                        outcomes[i] = error
                        del watchers[i]
                        # A group that could not form has run nothing, and decides nothing
                        # (a pool runs it again: see RankPool.run_each).
                        if stop_after_failure and not not_formed(error):
                            for j in [j for j in watchers if j > i]:
                                watchers.pop(j).close()
                                outcomes[j] = groups[j].stop(
                                    GroupStopped,
                                    _(
                                        "the group of {n} processes was stopped: the group of "
                                        "{failed} before it had failed"
                                    ).format(n=calls[j][1], failed=calls[i][1]),
                                    finished=[
                                        r for r in range(calls[j][1]) if groups[j].returned(r)
                                    ],
                                )
                if watchers:
                    pause(started)
        except BaseException:
            for group in groups:
                group.kill()
            raise
    return outcomes  # type: ignore[return-value]
