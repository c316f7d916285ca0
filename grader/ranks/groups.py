"""Run a case in every rank of a new process group of each size, side by side."""

import os
import time
from collections.abc import Callable
from typing import Any

from dplab.launched import Launched, LaunchError, RanksHung, RanksTimedOut
from dplab.rank_watch import LIBRARY_PARTS
from grader.base.outcomes import Attempt, MissingFunction, Raised, Stub, attempt, raised_in
from grader.ranks.judging import MISMATCH
from grader.ranks.launching import GroupStopped, launch_each
from grader.ranks.loopback import NO_LOOPBACK, loopback_is_up
from grader.ranks.plugins import backend_plugins_known
from grader.ranks.pools import in_open_pool
from labtext import _

WORLD_SIZES = (2, 3, 4)  # every case runs in groups of these sizes

# A stuck rank's stack shows the student's frames alone: none of the grader's (grader/).
LIBRARY_PARTS.append(os.path.dirname(os.path.dirname(__file__)) + os.sep)


def in_rank(call: Callable[[], Any]) -> Attempt:
    """In a rank: run the student's `call` through `attempt`, noting when it raised (so that
    the rank that failed first is the one reported). The stub or a missing function is noted
    as such."""
    try:
        outcome = attempt(call)
    except (NotImplementedError, MissingFunction) as error:  # (attempt lets only these by)
        outcome = Attempt(raised=Raised.from_exception(error))
    outcome.at = time.monotonic()
    return outcome


def group_record(done: Launched | LaunchError) -> dict:
    """Return what a launch gave as plain data: {"ranks": [what each returned], "outputs":
    [what each printed]}, or {"failed": why, "kind": "hung", "raised", "limit" or "stopped"
    (a smaller group had failed), "cause" (LaunchError.cause), "rank": the rank to blame or
    None, "finished": the ranks that had returned, "partial": what each of those returned
    (None for the others), "outputs"}; the kind is "mismatch" for a group that gloo stopped
    because its ranks' collective calls did not match."""
    outputs = [o[-2000:] for o in done.outputs]
    if isinstance(done, LaunchError):
        kinds = {RanksHung: "hung", RanksTimedOut: "limit", GroupStopped: "stopped"}
        kind = next((k for cls, k in kinds.items() if isinstance(done, cls)), "raised")
        if kind == "raised" and MISMATCH in str(done):
            kind = "mismatch"
        return {
            "failed": str(done)[-3000:],
            "kind": kind,
            "cause": done.cause,
            "rank": done.rank,
            "finished": done.finished,
            "partial": [done.results.get(r) for r in range(len(done.outputs))],
            "outputs": outputs,
        }
    return {"ranks": done.results, "outputs": outputs}


def in_every_size(factory: Callable, student, sizes=WORLD_SIZES) -> list[dict]:
    """Run `factory(student)()` in every process of a new gloo group of each size, the groups
    side by side; return a record per group (see `group_record`), smallest first. The checks
    judge the groups in that order, and the first that failed decides (`groups_finished`):
    once a group fails, the larger ones still running are stopped (a deadlock is called
    sooner in a small group, and the large ones would only wait on).
    `factory` is a function of the checks module (or a functools.partial of one with plain
    arguments): in `rank_pools`, ranks forked for an earlier case run it. Together the groups
    may use the case's processor-time limit, and each the group limits
    (`student.limits`: grader.base.limits). A stub stops the
    case as it would anywhere else. Every rank's body calls the student's function, so a
    missing function or an untouched stub (`untouched_stub`) stops it before any process
    starts, with the error every rank would have met."""
    if not loopback_is_up():  # the grader's fence, not the student: say so, and how to fix it
        raise RuntimeError(_(NO_LOOPBACK))
    stub = untouched_stub(student.fn)  # (student.fn raises MissingFunction, as a rank would)
    if stub is not None:
        raise stub
    limits = dict(backend="gloo", stop_after_failure=True, **student.limits.of_groups(len(sizes)))
    with backend_plugins_known():  # the ranks forked here inherit the answer
        launched = in_open_pool(factory, student, sizes, limits)
        if launched is None:  # no pool open for this notebook: the groups are forked now
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
