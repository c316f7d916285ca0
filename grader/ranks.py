"""Run a case in every process of a fresh process group, and note the torch.distributed calls
the student's code makes there. The checks of the distributed notebook share it.

A case calls `in_every_size(factory, student)`: for each group size, `factory(student)()` runs
in each process of a new group of processes forked from the grading child (dplab.distributed,
on gloo); the groups run side by side. What each returns comes back as plain data. A group
that deadlocks, crashes or runs past its limits does not end the case: its record says what
happened, which the checks turn into a failure that names the rank (`expect_ranks_finished`).

Forking a process that has imported torch costs some 30 ms of processor time, and a case
needs 9 processes. So the cases of a notebook's exercises share their processes
(`rank_pools`): each size's are forked at the first case that needs them, and every case still
gets a new process group, the random states the case had, and processes that no case has
failed in, stopped, or changed (a case that changes the grader's code or torch in a rank
fails there). An exercise whose cases hold names right with the reference's uses them too,
and they stop at its end (`reference_in_ranks`): no rank that has seen the reference serves
another exercise.

Nothing here solves an exercise: it starts processes, draws inputs from seeds and records.
"""

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from dplab.distributed import (
    LIBRARY_PARTS,
    GroupStopped,
    Launched,
    LaunchError,
    RankPool,
    RanksHung,
    RanksTimedOut,
    launch_each,
)
from grader.api import Crash, Fail, MissingFunction, Raised, Stub, Student, attempt, raised_in

if TYPE_CHECKING:
    from grader.sandbox.child import Snapshot

WORLD_SIZES = (2, 3, 4)  # every case runs in groups of these sizes
# Ranks that together compute next to nothing this long are deadlocked (those blocked in
# torch.distributed, found idle and deaf to Python, sooner: dplab.distributed.QUIET_SECONDS).
IDLE_SECONDS = 5.0
CPU_SECONDS = 60.0  # processor time of one group, all ranks together
WALL_SECONDS = 300.0  # a backstop

COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "broadcast_object_list",
)
POINT_TO_POINT = ("send", "recv", "isend", "irecv")
PEER = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}

# The functions as torch defines them, taken when the grader's modules load (before any
# student code): the recorders wrap these, and trusted computations call them.
ORIGINAL = {name: getattr(distributed_c10d, name) for name in COLLECTIVES + POINT_TO_POINT}
all_reduce = ORIGINAL["all_reduce"]
LIBRARY_PARTS.append(__file__)  # a stuck rank's stack shows the student's frames, not these


def _describe_call(name: str, args: tuple, kwargs: dict, describe: Callable | None) -> dict:
    """Return what a call passes: the tensor's size and dtype, its peer (point to point), and
    what `describe(name, tensor)` says of the tensor, asked at the time of the call."""
    record: dict[str, Any] = {"name": name, "at": time.monotonic()}
    tensor = args[0] if args else kwargs.get("tensor")
    if isinstance(tensor, torch.Tensor):
        record["numel"] = int(tensor.numel())
        record["nbytes"] = int(tensor.numel() * tensor.element_size())
        record["dtype"] = str(tensor.dtype).removeprefix("torch.")
        if describe is not None:
            record.update(describe(name, tensor) or {})
    if name in PEER:
        peer = args[1] if len(args) > 1 else kwargs.get(PEER[name])
        record["peer"] = int(peer) if isinstance(peer, int) else None
    if name == "all_reduce":
        op = args[1] if len(args) > 1 else kwargs.get("op", dist.ReduceOp.SUM)
        record["op"] = str(op).rpartition(".")[2]
    return record


@contextlib.contextmanager
def recording_calls(
    namespace: dict | None = None, describe: Callable[[str, torch.Tensor], dict] | None = None
) -> Iterator[list[dict]]:
    """Note every collective and point-to-point call made while the block runs, however the
    code reaches it (`dist.all_reduce`, `torch.distributed.all_reduce`, or a name imported
    into `namespace`, the student's notebook). The calls go through to torch unchanged;
    `describe(name, tensor)`, if given, adds to each call's record what it says of the tensor
    passed, before the call runs (see grader.checks.average_gradients' `held_in`)."""
    calls: list[dict] = []
    depth = [0]  # torch's own functions call each other (send calls isend): note the outer one
    wrappers = {}
    for name, original in ORIGINAL.items():

        @functools.wraps(original)
        def wrapper(*args, __name=name, __original=original, **kwargs):
            if depth[0] == 0:
                calls.append(_describe_call(__name, args, kwargs, describe))
            depth[0] += 1
            try:
                return __original(*args, **kwargs)
            finally:
                depth[0] -= 1

        wrappers[name] = wrapper
    with contextlib.ExitStack() as stack:
        for module in (dist, distributed_c10d):
            for name, wrapper in wrappers.items():
                if hasattr(module, name):
                    stack.enter_context(_swapped(module.__dict__, name, wrapper))
        if namespace is not None:
            for key, value in list(namespace.items()):
                for name, original in ORIGINAL.items():
                    if value is original:
                        stack.enter_context(_swapped(namespace, key, wrappers[name]))
        yield calls


@contextlib.contextmanager
def _swapped(where: dict, key: str, value: Any) -> Iterator[None]:
    before = where[key]
    where[key] = value
    try:
        yield
    finally:
        where[key] = before


def in_rank(call: Callable[[], Any]) -> dict:
    """In a rank: run the student's `call` through `attempt`, noting when it raised (so that
    the rank that failed first is the one reported). The stub or a missing function is noted
    as such."""
    try:
        outcome = attempt(call)
    except (NotImplementedError, MissingFunction) as error:  # (attempt lets only these by)
        outcome = {"returned": None, "raised": Raised.from_exception(error).as_data()}
    outcome["at"] = time.monotonic()
    return outcome


def group_record(done: Launched | LaunchError) -> dict:
    """Return what a launch gave as plain data: {"ranks": [what each returned], "outputs":
    [what each printed]}, or {"failed": why, "kind": "hung", "raised", "limit" or "stopped"
    (a smaller group had failed), "rank": the rank to blame or None, "finished": the ranks
    that had returned, "partial": what each of those returned (None for the others),
    "outputs"}; the kind is "mismatch" for a group that gloo stopped because its ranks'
    collective calls did not match."""
    outputs = [o[-2000:] for o in done.outputs]
    if isinstance(done, LaunchError):
        kinds = {RanksHung: "hung", RanksTimedOut: "limit", GroupStopped: "stopped"}
        kind = next((k for cls, k in kinds.items() if isinstance(done, cls)), "raised")
        if kind == "raised" and MISMATCH in str(done):
            kind = "mismatch"
        return {
            "failed": str(done)[-3000:],
            "kind": kind,
            "rank": done.rank,
            "finished": done.finished,
            "partial": [done.results.get(r) for r in range(len(done.outputs))],
            "outputs": outputs,
        }
    return {"ranks": done.results, "outputs": outputs}


class _Open(NamedTuple):
    """A pool open now (see rank_pools), the notebook it was opened for, what the grading
    child watched then (see pool_key), and while an exercise holds names right (see
    reference_in_ranks), the reference's cells, what they define and the student's own
    values of those names."""

    pool: RankPool
    namespace: dict
    where: str
    watched: "Snapshot"
    holding: list[tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]]


_pools: list[_Open] = []


@contextlib.contextmanager
def rank_pools(namespace: dict, where: str) -> Iterator[RankPool]:
    """Let the cases run in the block share their ranks, for any exercise of the notebook
    whose names are `namespace` (`where` names it): each size's ranks are forked once, at
    the first case that needs them, and serve the later cases, each in a new process group
    (dplab.distributed.RankPool). Ranks are forked again whenever what they would start from
    has changed (`pool_key`), or a case's run changed anything the grading relies on in them
    (see `unchanged`); they all stop at the end of the block. A block opened inside another
    has ranks of its own."""
    from grader.sandbox.child import Snapshot, watched_objects

    with RankPool(still_clean=unchanged) as pool:
        _pools.append(_Open(pool, namespace, where, Snapshot(watched_objects()), []))
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
    from grader.sandbox.child import Snapshot, watched_objects

    before = Snapshot(watched_objects())

    def in_rank() -> Callable[[], bool]:
        import os
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
                    f"the code changed the grader's own code or torch ({', '.join(changed)}) "
                    "in this process, so its results cannot be trusted"
                )
            return (
                os.getcwd() == folder and threading.active_count() == threads and not has_children()
            )

        return test

    return in_rank


class Tampered(RuntimeError):
    """A run in a rank changed what the grading relies on."""


def pool_key(student, watched: "Snapshot", held: dict[str, Any] | None = None) -> tuple:
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

    from grader.sandbox.child import run_reference_cells

    namespace = _pools[-1].namespace
    with contextlib.ExitStack() as stack:
        if cells:
            reference = run_reference_cells(list(cells))
            right = {name: reference[name] for name in held if name in reference}
            stack.enter_context(mock.patch.dict(namespace, right))
        torch.random.set_rng_state(states[0])
        random.setstate(states[1])
        if states[2] is not None and "numpy" in sys.modules:
            sys.modules["numpy"].random.set_state(states[2])
        return factory(Student(namespace, function, _pools[-1].where))()


def in_every_size(factory: Callable, student, sizes=WORLD_SIZES) -> list[dict]:
    """Run `factory(student)()` in every process of a new gloo group of each size, the groups
    side by side; return a record per group (see `group_record`), smallest first. The checks
    judge the groups in that order, and the first that failed decides (`groups_finished`):
    once a group fails, the larger ones still running are stopped (a deadlock is called
    sooner in a small group, and the large ones would only wait on).
    `factory` is a function of the checks module (or a functools.partial of one with plain
    arguments): in `rank_pools`, ranks forked for an earlier case run it. Together the groups
    may use the case's processor-time limit (CPU_SECONDS outside a grade). A stub stops the
    case as it would anywhere else. Every rank's body calls the student's function, so a
    missing function or an untouched stub (`untouched_stub`) stops it before any process
    starts, with the error every rank would have met."""
    from grader.sandbox.fence import NO_LOOPBACK, loopback_is_up
    from grader.sandbox.runner import case_seconds

    if not loopback_is_up():  # the grader's fence, not the student: say so, and how to fix it
        raise RuntimeError(NO_LOOPBACK)
    stub = untouched_stub(student.fn)  # (student.fn raises MissingFunction, as a rank would)
    if stub is not None:
        raise stub
    limits = dict(
        backend="gloo",
        timeout=WALL_SECONDS,
        idle_timeout=IDLE_SECONDS,
        cpu_limit=(case_seconds[0] or CPU_SECONDS) / len(sizes),
        stop_after_failure=True,
    )
    if _pools and _pools[-1].namespace is student.namespace:  # in rank_pools, for this notebook
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
        launched = opened.pool.run_each([(run, n) for n in sizes], key=key, **limits)
    else:
        launched = launch_each([(lambda: factory(student)(), n) for n in sizes], **limits)
    groups = []
    for n, done in zip(sizes, launched, strict=True):
        group = group_record(done)
        group["world_size"] = n
        groups.append(group)
        stub = first_stub(group)
        if stub is not None:
            raise stub
    return groups


# What a function may do and still be an untouched stub: look up NotImplementedError, load
# constants, call, raise (and what Python 3.11 to 3.13 add around these).
_STUB_STEPS = {"RESUME", "NOP", "CACHE", "PUSH_NULL", "PRECALL", "LOAD_GLOBAL", "LOAD_CONST"}


def untouched_stub(fn: Callable) -> Stub | None:
    """Return the NotImplementedError that calling `fn` raises, whatever its arguments, when
    its body does nothing but `raise NotImplementedError(...)` with constant arguments (the
    notebook's stub, a docstring and comments allowed); None for anything else. Read from
    its bytecode, so nothing of the student's runs."""
    import builtins
    import dis
    from types import FunctionType

    if type(fn) is not FunctionType or fn.__code__.co_names != ("NotImplementedError",):
        return None
    name = "NotImplementedError"
    found = dict.get(fn.__globals__, name, dict.get(fn.__builtins__, name))
    if found is not builtins.NotImplementedError:
        return None
    steps = [i for i in dis.get_instructions(fn.__code__) if i.opname not in _STUB_STEPS]
    loads = [i for i in dis.get_instructions(fn.__code__) if i.opname in _STUB_STEPS]
    constants = [i.argval for i in loads if i.opname == "LOAD_CONST"]
    if not all(isinstance(c, str | int | float | type(None)) for c in constants):
        return None
    if [i.opname for i in steps] == ["RAISE_VARARGS"] and not constants:
        return Stub("")  # raise NotImplementedError: its message is ""
    if (
        [i.opname for i in steps] == ["CALL", "RAISE_VARARGS"]
        and steps[0].arg == len(constants)
        and steps[1].arg == 1
    ):
        message = str(NotImplementedError(*constants))[:1000]  # as a rank reports it
        return Stub(message)
    return None


def first_stub(group: dict) -> Exception | None:
    """Return the error to raise in the case when a rank met a stub or a missing function."""
    for rank in group.get("ranks", []):
        raised = raised_in(rank)
        if raised is not None and raised.stub:
            return Stub(raised.message)
        if raised is not None and raised.type == "MissingFunction":
            return MissingFunction(raised.message)
    return None


# ---- for the checks, in the grader's process ----------------------------------------------


def starts_processes(exercise) -> bool:
    """Return True when an exercise's public checks run its cases in process groups."""
    import importlib

    module = importlib.import_module(exercise.checks)
    return any(getattr(v, "__module__", None) == __name__ for v in vars(module).values())


def autograd_threads_started() -> bool:
    """Return True when autograd has started its device threads in this process (PyTorch
    names them pt_autograd_N)."""
    import os

    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("pt_autograd"):
                    return True
        except OSError:
            pass
    return False


def apart(fn: Callable[..., Any], *args: Any, wait: float = 120.0) -> Any:
    """Return `fn(*args)`, computed in a forked process of its own where that matters.

    For the judges' own training and backward passes: autograd starts threads for the GPUs
    (and the lab's stand-in devices) at a process's first backward pass, and a process with
    those threads can no longer fork ranks that run backward. The checks of a notebook run in
    its kernel, which launches ranks later, so no judge may leave such threads there. Where
    the threads are already there (the grader's own process, after other exercises), forking
    could not help, and `fn` runs here. So it does when the copy has not answered within `wait`
    seconds: a copy forked while another of the process's threads held a lock (an import's,
    say) can wait for it forever.
    """
    import os
    import pickle
    import select
    import signal

    if autograd_threads_started():
        return fn(*args)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: compute, send, and leave without running any exit handler
        os.close(read_end)
        code = 0
        try:
            try:
                torch.set_num_threads(1)  # the parent's OpenMP threads are not here
                payload = pickle.dumps(("value", fn(*args)))
            except BaseException as error:  # the judge's own error, raised again in the parent
                payload = pickle.dumps(("error", f"{type(error).__name__}: {error}"))
                code = 1
            with os.fdopen(write_end, "wb") as out:
                out.write(payload)
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + wait
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while select.select([source], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = source.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        else:  # no answer in time: the copy is stuck, so compute here
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return fn(*args)
    data = b"".join(chunks)
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data) if data else ("error", "the computation's process died")
    if kind == "error":
        raise RuntimeError(f"the grader's own computation failed: {value}")
    return value


PEER_LOST = ("Connection closed by peer", "Connection reset by peer")
# What gloo says, as it aborts the process, when ranks make different collective calls at the
# same point (a call one rank skips, met by the others' next one): a deadlock by other means.
MISMATCH = "collective mismatch"
MISMATCH_HINT = (
    "The ranks made different collective calls at the same point, so gloo stopped: every rank "
    "must make the same collective calls in the same order (a call made on rank 0 alone, say "
    "an evaluation, meets the others' next call instead)."
)
DEADLOCK_HINT = (
    "Every rank must make the same calls in the same order: a blocking send on every rank "
    "at once waits forever (post the send with dist.isend, then recv, then wait), and so "
    "does a collective that some ranks skip."
)


def expect_ranks_finished(group: dict, what: str = "") -> list[dict]:
    """Return each rank's record of a group that finished; fail, naming the rank, if the
    group deadlocked or ran out of time; raise Crash with the first error if the student's
    code raised on a rank."""
    label = f"with {group.get('world_size', '?')} processes" + (f", {what}" if what else "")
    if "failed" in group:
        kind = group.get("kind")
        if kind == "hung" and group.get("finished"):
            raise Fail(f"{label}: {group['failed']}")  # the check's own hint names the call
        if kind == "hung":
            raise Fail(f"{label}: {group['failed']}", DEADLOCK_HINT)
        if kind in ("limit", "stopped"):
            raise Fail(f"{label}: {group['failed']}")
        if kind == "mismatch":
            raise Fail(f"{label}: {group['failed']}", MISMATCH_HINT)
        # A rank's process died (a crash inside torch, os._exit): judged as an error, so the
        # exercise's error hints can name the mistake behind it.
        raise Crash(Raised("RankFailed", f"{group['failed']} ({label})", "", ""))
    ranks = group["ranks"]
    crashed = [(r, raised_in(o)) for r, o in enumerate(ranks) if raised_in(o) is not None]
    crashed = [(r, raised) for r, raised in crashed if not raised.stub]
    lost = [r for r, raised in crashed if any(p in raised.message for p in PEER_LOST)]
    if crashed and len(lost) == len(crashed) and len(crashed) < len(ranks):
        # Only "peer gone" errors: a rank returned while the others still waited for it.
        left = [r for r in range(len(ranks)) if r not in lost]
        raise Fail(
            f"{label}: rank(s) {', '.join(map(str, left))} returned while rank(s) "
            f"{', '.join(map(str, lost))} still waited for them in a call to torch.distributed "
            "(which then failed: the connection was closed)"
        )
    if crashed:
        rank, raised = min(crashed, key=lambda item: float(ranks[item[0]].get("at", 0.0)))
        raise Crash(
            Raised(raised.type, f"{raised.message} (on rank {rank}, {label})", raised.where, "")
        )
    return ranks


def groups_finished(groups: list[dict], what: str = "") -> list[tuple[int, list[dict]]]:
    """Return (world size, ranks) for every group, failing as `expect_ranks_finished` does."""
    return [(g["world_size"], expect_ranks_finished(g, what)) for g in groups]


def ranks_that_returned(
    groups: list[dict], see: str, what: str = ""
) -> list[tuple[int, dict[int, dict]]]:
    """For a check about something other than the collectives (a mode, a sampler, a line
    printed): return (world size, {rank: record}) for every group, with every rank where the
    group finished and, where it deadlocked, the ranks that had returned before it was
    stopped (the larger groups stopped after it decided nothing). The deadlock is charged by
    the check `see`, which judges the collectives: where no rank is left to judge, this check
    fails naming it, and so keeps its points (grader.api.Fail). Calls that did not match
    (gloo stops such a group) count as a deadlock. A rank that raised, or a limit, fails as in
    `groups_finished`."""
    judged = []
    deadlocked = False
    for g in groups:
        if g.get("kind") in ("hung", "mismatch", "stopped"):
            deadlocked = deadlocked or g["kind"] != "stopped"
            ranks = {r: rec for r, rec in enumerate(g.get("partial") or []) if rec is not None}
            if ranks:
                judged.append((g["world_size"], ranks))
            continue
        judged.append((g["world_size"], dict(enumerate(expect_ranks_finished(g, what)))))
    if not judged:
        if deadlocked:
            raise Fail(
                "could not be judged: the ranks deadlocked before any of them returned", see=see
            )
        expect_ranks_finished(groups[0], what)  # a failure of another kind: say which
    return judged
