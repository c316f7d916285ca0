"""Ranks that serve the cases of a notebook's exercises, forked once and reused."""

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch

from dplab.launched import Launched, LaunchError
from grader.base.cases import Student
from grader.base.tampering import Snapshot, watched_objects
from grader.ranks.rankpool import RankPool
from labtext import _


class _Open(NamedTuple):
    """A pool open now (see rank_pools), the notebook it was opened for, what the grading
    child watched then (see pool_key), and while an exercise holds names right (see
    reference_in_ranks), the reference's cells, what they define and the student's own
    values of those names."""

    pool: RankPool
    namespace: dict
    where: str
    run_cells: Callable[[list[str]], dict] | None
    watched: Snapshot
    holding: list[tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]]


_pools: list[_Open] = []


@contextlib.contextmanager
def rank_pools(
    namespace: dict, where: str, run_cells: Callable[[list[str]], dict] | None = None
) -> Iterator[RankPool]:
    """Let the cases run in the block share their ranks, for any exercise of the notebook
    whose names are `namespace` (`where` names it): each size's ranks are forked once, at
    the first case that needs them, and serve the later cases, each in a new process group
    (grader.ranks.rankpool.RankPool). Ranks are forked again whenever what they would start from
    has changed (`pool_key`), or a case's run changed anything the grading relies on in them
    (see `unchanged`); they all stop at the end of the block. A block opened inside another
    has ranks of its own. `run_cells(cells)` runs the reference's cells in a rank and returns
    what they define, for an exercise that holds names right there (`reference_in_ranks`)."""
    with RankPool(still_clean=unchanged) as pool:
        _pools.append(_Open(pool, namespace, where, run_cells, Snapshot(watched_objects()), []))
        try:
            yield pool
        finally:
            _pools.pop()


_ABSENT = object()  # a held name the student's notebook does not define


@contextlib.contextmanager
def reference_in_ranks(cells: list[str], held: dict, names: Iterable[str]) -> Iterator[None]:
    """While an exercise whose cases hold `names` right with the reference's runs in the open
    pool (`held`: what the reference's `cells` define, run here): its cases use the ranks
    already there, each of which runs the cells and, for a run whose case holds names right,
    holds them right itself, as well as ranks forked now. At the end, every rank of the pool
    stops, so that no rank that has seen the reference serves another exercise."""
    if not _pools:
        yield
        return
    opened = _pools[-1]
    originals = {name: opened.namespace.get(name, _ABSENT) for name in names}
    opened.holding.append((tuple(cells), held, originals))
    try:
        yield
    finally:
        opened.holding.pop()
        opened.pool.close()


def unchanged() -> Callable[[], Callable[[], bool]]:
    """Before a group's ranks are forked: take a snapshot of what the grading relies on (the
    grader's modules, torch.distributed, the builtins: what the grading child watches in
    itself). Return what a rank calls right after its fork, which returns the test of the rank
    after a run: it raises when the run changed any of that, which fails the run, and returns
    False when the run left the rank in another folder, with threads running or with child
    processes alive (a DataLoader's workers), which then serves no more. (A snapshot reads
    every module: 20 ms in a new rank, as each read copies a page the rank shares with its
    parent, and a grade forks some 20 ranks.)"""
    before = Snapshot(watched_objects())

    def in_rank() -> Callable[[], bool]:
        import threading

        folder, threads = os.getcwd(), threading.active_count()

        def has_children() -> bool:
            """Whether this rank has a child process, running or not yet waited for (a
            DataLoader's workers kept alive: persistent ones, or an iterator kept in a global).
            Asks the system, not multiprocessing's list (which the code could empty, and which a
            rank forked by the launcher inherits from its parent), and waits for none."""
            try:
                os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return False
            return True

        def test() -> bool:
            changed = before.changed()
            if changed:
                raise Tampered(
                    _(
                        "the code changed the grader's own code or torch ({names}) "
                        "in this process, so its results cannot be trusted"
                    ).format(names=", ".join(changed))
                )
            return (
                os.getcwd() == folder and threading.active_count() == threads and not has_children()
            )

        return test

    return in_rank


class Tampered(RuntimeError):
    """A run in a rank changed what the grading relies on."""


def pool_key(student, watched: Snapshot, held: dict[str, Any] | None = None) -> tuple:
    """Return what ranks forked now would start from, as far as a case can change it: the
    student's names (a case may swap some) and what has changed since the `watched` snapshot
    of what the grading child watches (a case may patch it; attributes that torch adds as it
    goes, as the child's own watch does, are left out). The names `held` right with the
    reference's count as the student's own values (given): the ranks hold them right
    themselves. Ranks forked under another key are not used."""
    held = held or {}
    names = tuple(
        (name, id(held.get(name, value)))
        for name, value in student.namespace.items()
        if held.get(name) is not _ABSENT
    )
    return names, tuple(sorted(watched.changes().items()))


def _random_states() -> tuple:
    """Return the random generators' states here: torch's, Python's and NumPy's (if loaded)."""
    import random
    import sys

    numpy = sys.modules.get("numpy")
    return (
        torch.random.get_rng_state(),
        random.getstate(),
        numpy.random.get_state() if numpy is not None else None,
    )


def _in_pool(
    factory: Callable,
    function: str,
    states: tuple,
    cells: tuple[str, ...] = (),
    held: tuple[str, ...] = (),
) -> Any:
    """In a rank of a pool: hold the `held` names right with what the reference's `cells`
    define, start from the random states of the case that asked (as a rank forked for it
    would), then run what `factory(student)` returns, for the exercise's `function` in the
    namespace the pool was opened for."""
    import random
    import sys
    from unittest import mock

    namespace = _pools[-1].namespace
    with contextlib.ExitStack() as stack:
        if cells:
            run_cells = _pools[-1].run_cells
            assert run_cells is not None, "reference_in_ranks needs a pool given run_cells"
            reference = run_cells(list(cells))
            right = {name: reference[name] for name in held if name in reference}
            stack.enter_context(mock.patch.dict(namespace, right))
        torch.random.set_rng_state(states[0])
        random.setstate(states[1])
        if states[2] is not None and "numpy" in sys.modules:
            sys.modules["numpy"].random.set_state(states[2])
        return factory(Student(namespace, function, _pools[-1].where))()


def in_open_pool(
    factory: Callable, student, sizes: tuple[int, ...], limits: dict
) -> list[Launched | LaunchError] | None:
    """Run `factory(student)()` in a group of each size of the pool open for the student's
    notebook, with the names the case holds right and its random states; None where no pool
    is open for it (see `rank_pools`)."""
    if not _pools or _pools[-1].namespace is not student.namespace:
        return None
    opened = _pools[-1]
    cells, values, originals = opened.holding[-1] if opened.holding else ((), {}, {})
    held = {  # the names this case holds right now, with the student's values
        name: original
        for name, original in originals.items()
        if name in values and student.namespace.get(name, _ABSENT) is values[name]
    }
    states = _random_states()
    cells = cells if held else ()
    run = functools.partial(_in_pool, factory, student.function, states, cells, tuple(held))
    key = pool_key(student, opened.watched, held)
    return opened.pool.run_each([(run, n) for n in sizes], key=key, **limits)
