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
import math
import re

import torch
import torch.distributed as dist

from grader.api import (
    N_,
    Crash,
    Fail,
    SeenTensor,
    _,
    all_reduce,
    case,
    check_on,
    error_hints,
    expect,
    expect_close,
    expect_equal,
    expect_kept_dtype,
    groups_finished,
    in_every_size,
    in_rank,
    observe,
    recording_calls,
    short,
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


def inputs_for(seed: int, rank: int, kind: str, world: int) -> list[torch.Tensor]:
    """Return the tensors rank `rank` passes in, one per call: the ring all-reduce's kinds,
    and "exact": an int64 (values up to 2**40) and an int32 tensor, then the same values in
    float64 (their twins, which a right reduction sums exactly too), then a float64 tensor;
    every length (24 and 12) divides by 2, 3 and 4, so no chunk boundary shows there."""
    if kind != "exact":
        return tensors_for(seed, rank, kind, world)
    gen = torch.Generator().manual_seed(seed * 1013 + rank)
    ints = [
        torch.randint(-(2**40), 2**40, (4, 6), generator=gen),
        torch.randint(-1000, 1000, (12,), generator=gen, dtype=torch.int32),
    ]
    return [
        *ints,
        *(t.double() for t in ints),
        torch.randn(3, 4, generator=gen, dtype=torch.float64),
    ]


# Where the float64 twin of integer call i is: call i + TWIN (see `inputs_for`).
TWIN = 2


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
        for i, t in enumerate(inputs_for(seed, rank, kind, world)):
            if half == "reduce_scatter":
                total = t.clone()
                all_reduce(total)
                expected, given = whole(total, rank, world), (t.clone(),)
            else:  # every rank knows rank 0's tensor: each passes in its chunk of it
                full = inputs_for(seed, 0, kind, world)[i].flatten().clone()
                expected = full
                given = (full.tensor_split(world)[rank].clone(), full.numel())
            with recording_calls(student.namespace) as calls:
                outcome = in_rank(lambda given=given: student.fn(*given))
            if outcome.raised is not None:
                return {"records": records, "raised": outcome.raised, "at": outcome.at}
            records.append(
                {
                    "returned": outcome.returned,
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
    """int64 values up to 2**40 and int32 tensors, the same values in float64, and a float64
    tensor, of lengths that 2, 3 and 4 divide."""
    return run_half(student, ctx, "exact", "reduce_scatter")


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


@check_on(
    book_demo,
    points=2,
    hint="Rank 0 must get [3.] (the first half of [[3., 3.]]) and rank 1 [3.]. " + HALF_HINT,
)
def book_demo_gives_each_rank_its_half_of_the_sum(seen, ctx):
    """[[1., 1.]] on rank 0 and [[2., 2.]] on rank 1: each rank gets back [3.].
    Property: the book's demo; against the reference (its known result), a failure that random
    tensors show too being each_rank_gets_its_chunk_of_the_sum's."""
    expect_halves(seen, N_("the book's demo"), reduce_hint, see=MAIN)


@check_on(random_tensors, points=3, hint=HALF_HINT)
def each_rank_gets_its_chunk_of_the_sum(seen, ctx):
    """In groups of 2, 3 and 4, rank r gets chunk r of what dist.all_reduce gives.
    Property: each rank's chunk of the sum; against the reference (dist.all_reduce of the same
    tensors), the one check that compares it."""
    expect_halves(seen, N_("random float32"), reduce_hint)


@check_on(
    lengths_that_do_not_divide,
    points=2,
    hint="Cut with flat.tensor_split(world_size), as the chunks are defined: the first chunks "
    "are one value longer when world_size does not divide the length, and some are empty when "
    "there are fewer values than ranks; skip sending and receiving an empty chunk.",
)
def works_for_any_length(seen, ctx):
    """Lengths of 7, 13, 1, 2 and 3 elements reduce right in groups of 2, 3 and 4.
    Property: chunks of any length; against the reference, left to
    each_rank_gets_its_chunk_of_the_sum where it fails too (no relation: padding changes the
    chunks)."""
    expect_halves(seen, N_("a length that the world size does not divide"), reduce_hint, see=MAIN)


@check_on(
    integers_and_float64,
    points=1,
    hint="Receive into a buffer of the tensor's own dtype (torch.empty_like), and return the "
    "chunk in that dtype: integers must sum exactly.",
)
def keeps_dtypes_and_sums_integers_exactly(seen, ctx):
    """int64 (up to 2**40) and int32 tensors reduce exactly, to what the same values give in
    float64, and every result keeps its dtype.
    Property: dtypes kept and integers exact; a relation: each integer result against the code's
    own float64 result on the same values, on lengths every group size divides, so blind to
    chunk boundaries; then the exact sums, which float32 may have rounded in both, against
    dist.all_reduce's, left to the values check where it fails too."""
    expect_exact_dtypes(seen, N_("int64, int32 and float64"), MAIN)


def expect_exact_dtypes(seen: list[dict], what: str, main: str) -> None:
    """Fail unless every result keeps its input's dtype and holds no sum rounded to float32
    (`expect_kept_dtype`), each integer result equals the same rank's float64 twin (call
    i + TWIN) exactly, and every result equals the reference (`main`'s to charge where it
    fails too). Groups that deadlocked or raised are `main`'s as well; results of another
    length are left to the checks of the values, and where no result could be judged the
    check says so, charging nothing."""
    judged = 0
    try:
        groups = dict(groups_finished(seen))
        records = list(ring_records(seen))
    except (Fail, Crash) as error:
        error.see = error.see or main
        raise
    for n, rank, i, record in records:
        label = _("with {n} processes, rank {rank}'s call {number} ({what})").format(
            n=n, rank=rank, number=i + 1, what=_(what)
        )
        value, expected = flat_result(record["returned"], record["expected"])
        if value is None:
            continue
        judged += 1
        expect_kept_dtype(value, expected, label, None)
        own = groups[n][rank]["records"]
        twin = own[i + TWIN] if i + TWIN < len(own) and not expected.is_floating_point() else None
        mine, _twin_expected = flat_result(twin["returned"], expected) if twin else (None, None)
        if mine is not None:
            expect(
                torch.equal(value.double(), mine.double()),
                _(
                    "{label}: the integers summed to {got}, the same values in float64 to "
                    "{floats}: a right reduction gives both the same sums"
                ).format(label=label, got=short(value), floats=short(mine)),
            )
        # Integers that agree with the code's own float64 sums may both have gone through
        # float32: against the reference, on lengths where the values check passes, an
        # inexact sum is a dtype's doing; where that check fails too, it charges.
        if expected.is_floating_point():
            expect_close(value, expected, label, rtol=1e-5, atol=1e-5, see=main)
        else:
            expect_equal(value, expected, label, see=main)
    observe(judged, main, "no call returned a 1-D result of the tensor's length")


def expect_random_kind(groups: list[dict], kind: str, checks: dict[str, str]) -> None:
    """Fail unless every rank's call on a tensor of `kind` ("given:<dtype>:<shape>") returned
    what was expected. A wrong result whose cause a public check judges too is left to it
    where it fails too: a kind other than float32 whose result changed dtype, or that raised
    on a length 2, 3 and 4 divide, to `checks["dtype"]`; else a length that 2, 3 or 4 does
    not divide to `checks["length"]`, and the rest to `checks["main"]`."""
    _given, dtype, dims = kind.split(":")
    numel = math.prod(int(d) for d in dims.split("x"))
    uneven = any(numel % n for n in (2, 3, 4))
    owner = checks["length"] if uneven else checks["main"]
    kept = kept_dtypes(groups)
    crashed_on_dtype = kept is None and (not uneven or dtype_in_errors(groups, dtype))
    if dtype != "float32" and (kept is False or crashed_on_dtype):
        owner = checks["dtype"]
    try:
        expect_halves(groups, dtype + ":" + dims, see=owner)
    except (Fail, Crash) as error:
        error.see = error.see or owner
        raise


def dtype_in_errors(groups: list[dict], dtype: str) -> bool:
    """Return True when an error of the groups shows a dtype mistake: a cast refused, or a
    receive whose sizes differ by the ratio of the dtype's bytes to float32's (a float32
    buffer for an 8-byte tensor)."""
    said = [str(g.get("failed", "")) for g in groups]
    said += [
        str(getattr(rank.get("raised"), "message", ""))
        for g in groups
        for rank in g.get("ranks") or []
        if isinstance(rank, dict)
    ]
    ratio = getattr(torch, dtype).itemsize / 4
    for text in said:
        if "can't be cast" in text or "dtype" in text:
            return True
        for a, b in re.findall(r"(\d+) vs (\d+)", text):
            if ratio != 1 and int(b) and int(a) / int(b) in (ratio, 1 / ratio):
                return True
    return False


def kept_dtypes(groups: list[dict]) -> bool | None:
    """Return False when a result came back in another dtype than its input's, None when a
    group did not finish or a rank raised (nothing to tell), else True."""
    for group in groups:
        if "failed" in group:
            return None
        for rank in group["ranks"]:
            if rank.get("raised") is not None:
                return None
            for record in rank["records"]:
                got, expected = plain(record["returned"]), plain(record["expected"])
                if isinstance(got, torch.Tensor) and got.dtype != expected.dtype:
                    return False
    return True


def flat_result(returned, expected: torch.Tensor):
    """Return (the result flattened, expected) where the result is a tensor of the expected
    length, else (None, None): its shape and values are the other checks' to judge."""
    value = plain(returned)
    if not isinstance(value, torch.Tensor) or value.numel() != expected.numel():
        return None, None
    return value.reshape(-1), expected


@check_on(random_tensors, points=2, hint=P2P_HINT)
def uses_only_point_to_point_calls(seen, ctx):
    """No collective is called at all: the reduce-scatter is built from sends and receives.
    Property: no collective; against the reference (the calls the exercise allows), read from
    the recorded calls whatever the sums."""
    expect_point_to_point(seen)


NEIGHBOURS_HINT = N_(
    "A ring exchanges with its two neighbours only: at each of the N - 1 steps, send one "
    "chunk to rank + 1 and receive one from rank - 1 (or the other way round, the same for "
    "every rank). Sending each chunk straight to the rank that needs it (a loop over every "
    "rank, or dist.all_to_all) is not the ring the exercise asks for."
)
SIZE_HINT = N_(
    "Send one chunk, 1/world_size of the tensor, at each of the N - 1 steps: never the whole "
    "tensor, and no step twice."
)


def expect_ring_steps(seen: list[dict], main: str) -> None:
    """Fail unless, in every call, each rank sent only to one neighbour and received only
    from the other (the same direction on every rank), at most N - 1 non-empty chunks of at
    most ceil(numel / N) values. Read from the recorded sends and receives whatever the
    results were; groups that deadlocked or raised are `main`'s to charge, and a rank that
    made no send or receive at all (a collective instead) shows nothing to judge."""
    try:
        records = list(ring_records(seen))
    except (Fail, Crash) as error:
        error.see = error.see or main
        raise
    exchanges = [
        (n, rank, i, [c for c in record["calls"] if c["name"] in PEERS], record["numel"])
        for n, rank, i, record in records
    ]
    observe(
        any(calls for *_, calls, _numel in exchanges),
        "uses_only_point_to_point_calls",
        "no rank sent or received anything: its partners and chunks cannot be read",
    )
    directions = set()
    for n, rank, i, calls, numel in exchanges:
        sent = {c["peer"] for c in calls if c["name"] in ("send", "isend")}
        got = {c["peer"] for c in calls if c["name"] in ("recv", "irecv")}
        right, left = (rank + 1) % n, (rank - 1) % n
        way = "right" if sent <= {right} and got <= {left} else None
        if n > 2 and sent <= {left} and got <= {right}:
            way = way or "left"
        expect(
            way is not None,
            _(
                "with {n} processes, rank {rank} sent to {sent} and received from {got} "
                "(call {number}); its ring neighbours are {left} and {right}"
            ).format(
                n=n, rank=rank, sent=sorted(sent), got=sorted(got), number=i + 1, left=left,
                right=right,
            ),
            NEIGHBOURS_HINT,
        )  # fmt: skip
        if n > 2 and (sent or got):
            directions.add(way)
        sends = [c.get("numel", 0) for c in calls if c["name"] in ("send", "isend")]
        chunk = -(-numel // n)
        expect(
            len([s for s in sends if s]) <= n - 1 and max(sends, default=0) <= chunk,
            _(
                "with {n} processes, rank {rank} sent {sends} elements (call {number}, a tensor "
                "of {numel}); a ring sends N - 1 chunks of at most {chunk}"
            ).format(n=n, rank=rank, sends=sends, number=i + 1, numel=numel, chunk=chunk),
            SIZE_HINT,
        )
    expect(
        len(directions) <= 1,
        _("some ranks sent to their right-hand neighbour, others to their left-hand one"),
        NEIGHBOURS_HINT,
    )


PEERS = ("send", "isend", "recv", "irecv")


@check_on(random_tensors, points=1, hint=SIZE_HINT)
def exchanges_one_chunk_per_step_with_its_neighbours(seen, ctx):
    """Each rank sends only to one ring neighbour and receives only from the other: N - 1
    chunks of 1/N of the tensor, (N - 1) / N of it, half an all-reduce.
    Property: a ring between neighbours, one chunk a step; against the reference (the ring the
    exercise states), read from the recorded sends and receives whatever the sums, so no gate."""
    expect_ring_steps(seen, MAIN)


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
