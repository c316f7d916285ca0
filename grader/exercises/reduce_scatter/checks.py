"""Public checks of `reduce_scatter(tensor)`: each rank gets back its own chunk (tensor_split
into world_size) of the sum over the ranks of the flattened tensor, passed around a ring
with point-to-point sends and receives.

Each case runs in groups of 2, 3 and 4 processes (grader.ranks), with the tensors of the
ring all-reduce's checks (grader.exercises.ring_allreduce.checks). Every rank first computes
what torch.distributed.all_reduce gives for the same tensors, in the grader's code, then
calls the student's function, recording the calls it makes. `all_gather`'s checks use the
same machinery (`half_body`, `expect_halves`).
"""

import functools

import torch
import torch.distributed as dist

from grader.api import (
    N_,
    Fail,
    SeenTensor,
    _,
    all_reduce,
    case,
    check,
    error_hints,
    expect,
    expect_close,
    expect_equal,
    groups_finished,
    in_every_size,
    in_rank,
    recording_calls,
)
from grader.exercises.ring_allreduce.checks import (
    SUMMING,
    each_kind,
    expect_point_to_point,
    ring_records,
    tensors_for,
)

HALF_HINT = N_(
    "Cut the flattened tensor into world_size chunks (tensor_split) and pass them round the "
    "ring: in step s, send chunk (rank - s - 1) to rank + 1, receive chunk (rank - s - 2) "
    "from rank - 1 and add it into your copy. After N - 1 steps, return chunk rank."
)
SHIFTED_HINT = N_(
    "Each rank returned another rank's chunk of the sum: with the steps of the ring "
    "all-reduce, rank r ends holding chunk r + 1. Shift the chunks by one (send chunk "
    "(rank - s - 1), receive chunk (rank - s - 2)) so that rank r ends with chunk r."
)
P2P_HINT = N_(
    "Use only point-to-point calls (dist.send, dist.recv, dist.isend, dist.irecv); no "
    "dist.reduce_scatter, all_reduce, all_gather, broadcast or barrier."
)


def whole(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """What the grader expects of reduce_scatter: rank's chunk of the sum (t holds the sum)."""
    return t.flatten().tensor_split(world)[rank].clone()


def half_body(student, seed: int, kind: str, half: str):
    """Return the function each rank runs: for each of its tensors, the trusted result, then
    the student's call, recording the calls it makes. `half` is "reduce_scatter" (the
    student's function gets the rank's own tensor) or "all_gather" (it gets rank's chunk of a
    tensor that every rank knows, and that tensor's length). The first call that raises ends
    the rank's list (the other ranks could not keep in step)."""

    def body():
        rank, world = dist.get_rank(), dist.get_world_size()
        records: list[dict] = []
        for i, t in enumerate(tensors_for(seed, rank, kind, world)):
            if half == "reduce_scatter":
                total = t.clone()
                all_reduce(total)
                expected, given = whole(total, rank, world), (t.clone(),)
            else:  # every rank knows rank 0's tensor: each passes in its chunk of it
                full = tensors_for(seed, 0, kind, world)[i].flatten().clone()
                expected = full
                given = (full.tensor_split(world)[rank].clone(), full.numel())
            with recording_calls(student.namespace) as calls:
                outcome = in_rank(lambda given=given: student.fn(*given))
            if outcome["raised"] is not None:
                return {"records": records, "raised": outcome["raised"], "at": outcome["at"]}
            records.append(
                {
                    "returned": outcome["returned"],
                    "expected": expected,
                    "calls": calls,
                    "numel": t.numel(),
                }
            )
        return {"records": records, "raised": None}

    return body


def run_half(student, ctx, kind: str, half: str, sizes=(2, 3, 4)) -> list[dict]:
    body = functools.partial(half_body, seed=ctx.seed, kind=kind, half=half)
    return in_every_size(body, student, sizes)


@case
def book_demo(student, ctx):
    """The book's demo over two processes: rank 0 holds [[1, 1]], rank 1 [[2, 2]]."""
    return run_half(student, ctx, "book", "reduce_scatter", sizes=(2,))


@case
def random_tensors(student, ctx):
    """Four random float32 tensors per rank (1-D to 3-D), with lengths that 2, 3 and 4 divide."""
    return run_half(student, ctx, "random", "reduce_scatter")


@case
def lengths_that_do_not_divide(student, ctx):
    """Tensors of 7, 13, 1, 2 and 3 elements: remainders, and fewer elements than ranks."""
    return run_half(student, ctx, "uneven", "reduce_scatter")


@case
def integers_and_float64(student, ctx):
    """int64 values up to 2**40, int32 and float64 tensors."""
    return run_half(student, ctx, "dtypes", "reduce_scatter")


@case
def given_kinds(student, ctx, kinds: list[str]):
    """Tensors the grader describes ("given:<dtype>:<shape>"), one call each."""
    return each_kind(kinds, lambda kind: run_half(student, ctx, kind, "reduce_scatter"))


# ---- judging ------------------------------------------------------------------------------


def plain(value):
    return value.value if isinstance(value, SeenTensor) else value


def shifted(got, n: int, rank: int, ranks: list, i: int) -> bool:
    """Return True when the rank returned the chunk that another rank should have."""
    got = plain(got)
    if not isinstance(got, torch.Tensor):
        return False
    for other in range(n):
        if other == rank:
            continue
        theirs = (
            plain(ranks[other]["records"][i]["expected"])
            if i < len(ranks[other]["records"])
            else None
        )
        if (
            isinstance(theirs, torch.Tensor)
            and theirs.shape == got.reshape(-1).shape
            and theirs.numel()
            and torch.allclose(got.reshape(-1).double(), theirs.double(), 1e-5, 1e-5)
        ):
            return True
    return False


def expect_halves(seen: list[dict], what: str, hint_of=None, see: str | None = None) -> None:
    """Fail unless every rank's call returned what was expected (1-D, the same dtype),
    computed without a collective; `hint_of(n, rank, i, record, ranks)` names a mistake that
    the values show, and `see` the check that owns a wrong value where it fails too."""
    finished = dict(groups_finished(seen))
    for n, rank, i, record in ring_records(seen):
        label = _("with {n} processes, rank {rank}'s call {number} ({what})").format(
            n=n, rank=rank, number=i + 1, what=_(what)
        )
        names = [c["name"] for c in record["calls"] if c["name"] in SUMMING]
        if names:
            raise Fail(
                _(
                    "{label} called torch.distributed.{collective}, not only sends and receives"
                ).format(label=label, collective=names[0]),
                _("The exercise is the ring itself: use only dist.send/recv/isend/irecv."),
                see="uses_only_point_to_point_calls",
            )
        got, expected = record["returned"], record["expected"]
        value = plain(got)
        if (
            isinstance(value, torch.Tensor)
            and value.dim() != 1
            and value.numel() == expected.numel()
        ):
            got = value.reshape(-1)  # the right values in another shape: not this check's cause
        hint = hint_of(n, rank, i, record, finished[n]) if hint_of else None
        if expected.is_floating_point():
            expect_close(got, expected, label, hint, rtol=1e-5, atol=1e-5, see=see)
        else:
            expect_equal(got, expected, label, hint, see=see)


def reduce_hint(n, rank, i, record, ranks):
    return SHIFTED_HINT if shifted(record["returned"], n, rank, ranks, i) else None


MAIN = (
    "each_rank_gets_its_chunk_of_the_sum"  # the other value checks defer to it where it fails too
)


@check(
    book_demo,
    points=2,
    hint="Rank 0 must get [3.] (the first half of [[3., 3.]]) and rank 1 [3.]. " + HALF_HINT,
)
def book_demo_gives_each_rank_its_half_of_the_sum(seen, ctx):
    """[[1., 1.]] on rank 0 and [[2., 2.]] on rank 1: each rank gets back [3.]."""
    expect_halves(seen, N_("the book's demo"), reduce_hint, see=MAIN)


@check(random_tensors, points=3, hint=HALF_HINT)
def each_rank_gets_its_chunk_of_the_sum(seen, ctx):
    """In groups of 2, 3 and 4, rank r gets chunk r of what dist.all_reduce gives."""
    expect_halves(seen, N_("random float32"), reduce_hint)


@check(
    lengths_that_do_not_divide,
    points=2,
    hint="Cut with flat.tensor_split(world_size), as the chunks are defined: the first chunks "
    "are one value longer when world_size does not divide the length, and some are empty when "
    "there are fewer values than ranks; skip sending and receiving an empty chunk.",
)
def works_for_any_length(seen, ctx):
    """Lengths of 7, 13, 1, 2 and 3 elements reduce right in groups of 2, 3 and 4."""
    expect_halves(seen, N_("a length that the world size does not divide"), reduce_hint, see=MAIN)


@check(
    integers_and_float64,
    points=1,
    hint="Receive into a buffer of the tensor's own dtype (torch.empty_like), and return the "
    "chunk in that dtype: integers must sum exactly.",
)
def keeps_dtypes_and_sums_integers_exactly(seen, ctx):
    """int64 (up to 2**40) and int32 tensors reduce exactly, float64 ones closely."""
    expect_halves(seen, N_("int64, int32 and float64"), reduce_hint, see=MAIN)


@check(random_tensors, points=2, hint=P2P_HINT)
def uses_only_point_to_point_calls(seen, ctx):
    """No collective is called at all: the reduce-scatter is built from sends and receives."""
    expect_point_to_point(seen)


def expect_one_chunk_per_step(seen: list[dict]) -> None:
    for n, rank, i, record in ring_records(seen):
        sends = [c.get("numel", 0) for c in record["calls"] if c["name"] in ("send", "isend")]
        chunk = -(-record["numel"] // n)
        expect(
            len([s for s in sends if s]) <= n - 1 and max(sends, default=0) <= chunk,
            _(
                "with {n} processes, rank {rank} sent {sends} elements (call {number}, a tensor "
                "of {numel}); a ring sends N - 1 chunks of at most {chunk}"
            ).format(n=n, rank=rank, sends=sends, number=i + 1, numel=record["numel"], chunk=chunk),
        )


@check(
    random_tensors,
    points=1,
    hint="Send one chunk, 1/world_size of the tensor, at each of the N - 1 steps: never the "
    "whole tensor, and no step twice.",
    after=("each_rank_gets_its_chunk_of_the_sum", "uses_only_point_to_point_calls"),
    because="the chunks are counted from the sends of a ring that works with sends alone",
)
def sends_one_chunk_per_step(seen, ctx):
    """Each rank sends N - 1 chunks of 1/N of the tensor: (N - 1) / N of it, half an
    all-reduce."""
    expect_one_chunk_per_step(seen)


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "Received data size doesn't match" in raised.message or "preamble" in raised.message:
        return _(
            "A receive got a different number of elements, or of bytes, than it expected: both "
            "ends of a step must agree on the chunk, and the buffer must have the tensor's dtype."
        )
    if "Default process group has not been initialized" in raised.message:
        return _("Call the function inside a process group: use d2l.launch(...) in the notebook.")
    return None
