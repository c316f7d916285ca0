"""Record the torch.distributed calls that the student's code makes in a rank."""

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

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
all_reduce = ORIGINAL["all_reduce"]  # torch's own, for the judges' trusted computations


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
        record["peer"] = _peer(name, args, kwargs)
    if name == "all_reduce":
        op = args[1] if len(args) > 1 else kwargs.get("op", dist.ReduceOp.SUM)
        record["op"] = str(op).rpartition(".")[2]
    return record


def _peer(name: str, args: tuple, kwargs: dict) -> int | None:
    """The global rank a point-to-point call talks to, given as `dst`/`src` or, as
    `dist.batch_isend_irecv` passes it, as a rank in the call's group (`group_dst`)."""
    peer = args[1] if len(args) > 1 else kwargs.get(PEER[name])
    if isinstance(peer, int):
        return int(peer)
    in_group = kwargs.get(f"group_{PEER[name]}")
    if not isinstance(in_group, int):
        return None
    group = args[2] if len(args) > 2 else kwargs.get("group")
    if group is None or group is distributed_c10d.GroupMember.WORLD:
        return in_group
    try:
        return distributed_c10d.get_global_rank(group, in_group)
    except (RuntimeError, ValueError):
        return None


@contextlib.contextmanager
def recording_calls(
    namespace: dict | None = None, describe: Callable[[str, torch.Tensor], dict] | None = None
) -> Iterator[list[dict]]:
    """Note every collective and point-to-point call made while the block runs, however the
    code reaches it (`dist.all_reduce`, `torch.distributed.all_reduce`, or a name imported
    into `namespace`, the student's notebook). The calls go through to torch unchanged;
    `describe(name, tensor)`, if given, adds to each call's record what it says of the tensor
    passed, before the call runs (see grader.exercises.average_gradients.checks' `held_in`)."""
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
