"""Public checks of `ring_allreduce(tensor)`: a sum over every rank, in place, passed around
a ring with point-to-point sends and receives.

Each case runs in groups of 2, 3 and 4 processes (grader.ranks). Every rank hands the
student's function its own tensor; the checks compare what each rank ends with against
`torch.distributed.all_reduce` of the same tensors, computed by the grader's code in the same
processes just before, and look at the calls the function made on the way.
"""

import functools

import torch
import torch.distributed as dist

from grader.api import (
    COLLECTIVES,
    N_,
    Fail,
    SeenTensor,
    _,
    all_reduce,
    case,
    charged_by,
    check_on,
    error_hints,
    expect,
    expect_close,
    expect_equal,
    expect_kept_dtype,
    groups_finished,
    in_every_size,
    in_rank,
    recording_calls,
    short,
)

SUMS = "every_rank_holds_the_sum"  # the one check of the sums against dist.all_reduce
POINT_TO_POINT = "uses_only_point_to_point_calls"  # the one check of the calls made
# Collectives that move data: a ring that calls one did not do the summing itself.
SUMMING = tuple(c for c in COLLECTIVES if c not in ("barrier",))
RING_HINT = N_(
    "Split the flattened tensor into world_size chunks (tensor_split). Reduce-scatter: in "
    "step s, send chunk (rank - s) to rank + 1, receive chunk (rank - s - 1) from rank - 1 and "
    "add it in. All-gather: pass the finished chunks around the ring the same way, copying "
    "instead of adding."
)
IN_PLACE_HINT = N_(
    "The tensor passed in came back unchanged: the sum went into a copy. Work on "
    "tensor.view(-1), a view that shares the tensor's memory (or copy the result back with "
    "tensor.copy_(...))."
)
DTYPE_HINT = N_(
    "Keep the tensor's dtype: add received chunks into it with += (receive into a buffer of "
    "the same dtype); never go through float32."
)
STOPPED_HINT = N_(
    "Only the reduce-scatter ran: after it, each rank holds the full sum of one chunk only. "
    "Add the all-gather: N - 1 more steps that pass the finished chunks around the ring."
)


def tensors_for(seed: int, rank: int, kind: str, world: int) -> list[torch.Tensor]:
    """Return the tensors rank `rank` passes in, one per call: the same for a seed, a rank and
    a kind on every machine."""
    gen = torch.Generator().manual_seed(seed * 1009 + rank)
    if kind == "book":
        return [torch.ones((1, 2)) * (rank + 1)]
    if kind == "random":  # lengths that every world size from 2 to 4 divides
        return [torch.randn(shape, generator=gen) for shape in [(24,), (4, 6), (2, 3, 12), (360,)]]
    if kind == "uneven":  # lengths that leave a remainder, and fewer elements than ranks
        return [torch.randn(n, generator=gen) for n in (7, 13, 1, 2, 3)]
    if kind.startswith("given:"):  # "given:<dtype>:<d1>x<d2>...", for the hidden checks
        _, dtype_name, dims = kind.split(":")
        shape = tuple(int(d) for d in dims.split("x"))
        dtype = getattr(torch, dtype_name)
        if dtype.is_floating_point:
            return [torch.randn(shape, generator=gen, dtype=dtype)]
        return [torch.randint(-999, 999, shape, generator=gen, dtype=dtype)]
    if kind == "dtypes":  # lengths that every world size divides: only the dtypes differ
        ints = [
            torch.randint(-(2**40), 2**40, (6, 4), generator=gen),
            torch.randint(-1000, 1000, (12,), generator=gen, dtype=torch.int32),
        ]  # then their twins (see TWIN and SHIFTED): the same values in float64, and plus one
        return [
            *ints,
            *(t.double() for t in ints),
            torch.randn(3, 4, generator=gen, dtype=torch.float64),
            *(t + 1 for t in ints),
        ]
    raise ValueError(kind)


def ring_body(student, seed: int, kind: str):
    """Return the function each rank runs: for each of its tensors, the trusted all_reduce of
    a copy, then the student's ring on the tensor itself, recording the calls it makes. The
    first call that raises ends the rank's list (the others could not keep in step)."""

    def body():
        rank, world = dist.get_rank(), dist.get_world_size()
        records: list[dict] = []
        for t in tensors_for(seed, rank, kind, world):
            expected = t.clone()
            all_reduce(expected)
            given = t.clone()
            with recording_calls(student.namespace) as calls:
                outcome = in_rank(lambda given=given: student.fn(given))
            if outcome.raised is not None:
                return {"records": records, "raised": outcome.raised, "at": outcome.at}
            records.append({"given": given, "expected": expected, "calls": calls})
        return {"records": records, "raised": None}

    return body


def run_ring(student, ctx, kind: str, sizes=(2, 3, 4)) -> list[dict]:
    return in_every_size(functools.partial(ring_body, seed=ctx.seed, kind=kind), student, sizes)


@case
def book_demo(student, ctx):
    """The book's demo over two processes: rank 0 holds [[1, 1]], rank 1 [[2, 2]]."""
    return run_ring(student, ctx, "book", sizes=(2,))


@case
def random_tensors(student, ctx):
    """Four random float32 tensors per rank (1-D to 3-D), with lengths that 2, 3 and 4 divide."""
    return run_ring(student, ctx, "random")


@case
def lengths_that_do_not_divide(student, ctx):
    """Tensors of 7, 13, 1, 2 and 3 elements: remainders, and fewer elements than ranks."""
    return run_ring(student, ctx, "uneven")


def each_kind(kinds: list[str], run) -> list[list[dict]]:
    """Return `run(kind)` for each kind in turn; after one whose groups deadlocked or ran out
    of time, the other kinds are not tried."""
    results = []
    for kind in kinds:
        results.append(run(kind))
        if any(group.get("kind") in ("hung", "limit") for group in results[-1]):
            break
    return results


@case
def given_kinds(student, ctx, kinds: list[str]):
    """Tensors the grader describes ("given:<dtype>:<shape>"), one call each (after a group
    that deadlocked or ran out of time, the other kinds are not tried)."""
    return each_kind(kinds, lambda kind: run_ring(student, ctx, kind))


@case
def integers_and_float64(student, ctx):
    """int64 values up to 2**40 and int32 tensors, the same values in float64, a float64
    tensor, and the integers plus one."""
    return run_ring(student, ctx, "dtypes")


# ---- judging ------------------------------------------------------------------------------


def ring_records(seen: list[dict]):
    """Yield (world size, rank, call number, record) for every call of every group, failing
    as grader.ranks does for groups that did not finish or ranks whose call raised."""
    for n, ranks in groups_finished(seen):
        for rank, finished in enumerate(ranks):
            for i, record in enumerate(finished["records"]):
                expected = record["expected"]
                if isinstance(expected, SeenTensor):  # computed by the grader's code
                    record = {**record, "expected": expected.value}
                yield n, rank, i, record


def summed_by_a_collective(record: dict) -> str | None:
    names = [c["name"] for c in record["calls"] if c["name"] in SUMMING]
    return names[0] if names else None


def stopped_after_reduce_scatter(given: torch.Tensor, expected: torch.Tensor, n: int) -> bool:
    """Return True when one chunk holds the sum and every element of the others does not: the
    reduce-scatter ran, the all-gather did not."""
    right = torch.isclose(given.flatten().double(), expected.flatten().double(), 1e-5, 1e-5)
    chunks = right.tensor_split(n)
    whole = [bool(c.all()) for c in chunks if c.numel()]
    return sum(whole) == 1 and all(not c.any() for c in chunks if c.numel() and not c.all())


def left_alone(given: torch.Tensor, original: torch.Tensor) -> bool:
    """Return True when the tensor passed in still holds its own values."""
    return given.shape == original.shape and torch.equal(given, original)


def expect_sums(seen: list[dict], ctx, kind: str, what: str) -> None:
    """Fail unless every rank's tensor holds what all_reduce gave, summed by the ring; the
    hint names a mistake where the values show it (a dtype changed, the sum left in a copy,
    the all-gather missing)."""
    for n, rank, i, record in ring_records(seen):
        label = _("with {n} processes, rank {rank}'s tensor {number} ({what})").format(
            n=n, rank=rank, number=i + 1, what=_(what)
        )
        collective = summed_by_a_collective(record)
        if collective:
            raise Fail(
                _(
                    "{label} was summed by torch.distributed.{collective}, not by a ring of "
                    "sends and receives"
                ).format(label=label, collective=collective),
                _("The exercise is the ring itself: use only dist.send/recv/isend/irecv."),
                see=POINT_TO_POINT,
            )
        given, expected = record["given"], record["expected"]
        value = given.value if isinstance(given, SeenTensor) else given
        hint = None
        if isinstance(value, torch.Tensor) and value.shape == expected.shape:
            expect_kept_dtype(value, expected, label, DTYPE_HINT)
            if left_alone(value, tensors_for(ctx.seed, rank, kind, n)[i]):
                hint = IN_PLACE_HINT
            elif expected.is_floating_point() and stopped_after_reduce_scatter(value, expected, n):
                hint = STOPPED_HINT
        if expected.is_floating_point():
            expect_close(given, expected, label, hint, rtol=1e-5, atol=1e-5)
        else:
            expect_equal(given, expected, label, hint)


@check_on(
    book_demo,
    points=2,
    hint="Each rank must end with the sum of both tensors: [[3., 3.]]. " + RING_HINT,
)
def book_demo_gives_threes_on_both_ranks(seen, ctx):
    """[[1., 1.]] on rank 0 and [[2., 2.]] on rank 1 both become [[3., 3.]].
    Property: the book's demo; against the reference (its known result, [[3., 3.]] on both ranks,
    which dist.all_reduce gives)."""
    with charged_by(SUMS):
        expect_sums(seen, ctx, "book", N_("the book's demo"))


@check_on(random_tensors, points=3, hint=RING_HINT)
def every_rank_holds_the_sum(seen, ctx):
    """In groups of 2, 3 and 4, every rank's tensor equals dist.all_reduce of the same tensors.
    Property: the sum on every rank; against the reference (dist.all_reduce of the same float32
    tensors, in groups of 2, 3 and 4)."""
    expect_sums(seen, ctx, "random", N_("random float32"))


@check_on(
    lengths_that_do_not_divide,
    points=2,
    hint="The chunks must cover the whole tensor when world_size does not divide its length, "
    "and some chunks are empty when it has fewer elements than ranks: "
    "flat.tensor_split(world_size) gives such chunks; skip sending and receiving empty ones "
    "on both sides.",
)
def sums_tensors_of_any_length(seen, ctx):
    """Lengths of 7, 13, 1, 2 and 3 elements sum right in groups of 2, 3 and 4.
    Property: any length; against the reference (dist.all_reduce of tensors of 7, 13, 1, 2 and 3
    elements)."""
    with charged_by(SUMS):
        expect_sums(seen, ctx, "uneven", N_("a length that the world size does not divide"))


# The "dtypes" calls (see `tensors_for`): the integer tensors are calls 0 and 1; the float64
# twin of integer call i is call i + TWIN, and the same values plus one are call i + SHIFTED.
INTEGERS, TWIN, SHIFTED = 2, 2, 5


@check_on(
    integers_and_float64,
    points=1,
    hint="Each rank's tensor must end holding the sum in its own dtype, exactly for integers.",
)
def keeps_dtypes_and_sums_integers_exactly(seen, ctx):
    """int64 (up to 2**40) and int32 tensors sum exactly: to what the same values sum to in
    float64, and to N more when every one of the N ranks adds one; every tensor keeps its dtype.
    Property: dtypes and exact integer sums; a relation: each rank's int64 and int32 results
    against its own results on the same values in float64 and on the values plus one, and each
    result's dtype against its input's."""
    expect_exact_dtypes(seen, N_("int64, int32 and float64"))


def expect_exact_dtypes(seen: list[dict], what: str) -> None:
    """Fail unless every tensor kept its dtype and each integer tensor holds exactly what the
    same rank's float64 twin holds, and N less than its twin plus one (a sum computed in
    float32 loses the one). Groups that deadlocked or raised, a collective and the values
    themselves are other checks' to charge (every_rank_holds_the_sum,
    uses_only_point_to_point_calls): a result that is no sum at all misses the one too, and
    is every_rank_holds_the_sum's where that fails; a tensor whose shape changed is
    sums_in_place's."""
    with charged_by(SUMS):
        records = list(ring_records(seen))
    results = {(n, rank, i): plain(record["given"]) for n, rank, i, record in records}
    for n, rank, i, record in records:
        label = _("with {n} processes, rank {rank}'s tensor {number} ({what})").format(
            n=n, rank=rank, number=i + 1, what=_(what)
        )
        value, expected = results[n, rank, i], record["expected"]
        if not isinstance(value, torch.Tensor) or value.shape != expected.shape:
            continue
        expect_kept_dtype(value, value.to(expected.dtype), label, DTYPE_HINT)
        if i >= INTEGERS:
            continue
        floats, shifted = results.get((n, rank, i + TWIN)), results.get((n, rank, i + SHIFTED))
        if isinstance(floats, torch.Tensor) and floats.shape == value.shape:
            expect_kept_dtype(value, floats.to(value.dtype), label, DTYPE_HINT)
            expect(
                torch.equal(value.double(), floats.double()),
                _(
                    "{label}: the integers summed to {got}, the same values in float64 to "
                    "{floats}; a right ring gives both the same sums"
                ).format(label=label, got=short(value), floats=short(floats)),
            )
        if isinstance(shifted, torch.Tensor) and shifted.shape == value.shape:
            expect(
                torch.equal(shifted - value, torch.full_like(value, n)),
                _(
                    "{label}: the integers summed to {got}, the same values plus one on each of "
                    "the {n} ranks to {shifted}; an exact sum grows by {n}"
                ).format(label=label, got=short(value), shifted=short(shifted), n=n),
                DTYPE_HINT,
                see=SUMS,  # no sum at all (a copy summed, a ring cut short) shows here too
            )


def plain(value):
    return value.value if isinstance(value, SeenTensor) else value


@check_on(
    random_tensors,
    points=1,
    hint="Work on tensor.view(-1) (a view, not a copy) so that receiving into a chunk writes "
    "into the caller's tensor; if you had to copy, copy the result back with tensor.copy_().",
)
def sums_in_place(seen, ctx):
    """The tensor passed in holds the sum afterwards, with its shape: the caller sees it.
    Property: the tensor passed in keeps its shape (its values are every_rank_holds_the_sum's); a
    relation: the tensor's shape after the call against its shape before it."""
    with charged_by(SUMS):
        records = list(ring_records(seen))
    for n, rank, i, record in records:
        given = record["given"]
        shape = tuple(record["expected"].shape)
        expect(
            isinstance(given, SeenTensor) and given.shape == shape,
            _(
                "with {n} processes, rank {rank}'s tensor {number} no longer has shape {shape}"
            ).format(n=n, rank=rank, number=i + 1, shape=shape),
            see=SUMS,
        )


@check_on(
    random_tensors,
    points=2,
    hint="Use only point-to-point calls (dist.send, dist.recv, dist.isend, dist.irecv); "
    "no dist.all_reduce, reduce_scatter, all_gather, broadcast or barrier.",
)
def uses_only_point_to_point_calls(seen, ctx):
    """No collective is called at all: the ring is built from sends and receives.
    Property: only sends and receives; against the reference (the exercise's rule, read from the
    recorded calls: no collective, and some send)."""
    expect_point_to_point(seen)


def expect_point_to_point(seen: list[dict]) -> None:
    """Fail unless every rank's calls are sends and receives, some of them sends."""
    with charged_by(SUMS):
        records = list(ring_records(seen))
    for n, rank, _i, record in records:
        names = sorted({c["name"] for c in record["calls"] if c["name"] in COLLECTIVES})
        expect(
            not names,
            _("with {n} processes, rank {rank} called {calls}").format(
                n=n, rank=rank, calls=", ".join("dist." + x for x in names)
            ),
        )
        expect(
            any(c["name"] in ("send", "isend") for c in record["calls"]),
            _("with {n} processes, rank {rank} sent nothing to another rank").format(
                n=n, rank=rank
            ),
        )


@check_on(
    random_tensors,
    points=1,
    hint="In a ring, rank r sends only to (r + 1) % world_size and receives only from "
    "(r - 1) % world_size (or the other way round, the same for every rank).",
)
def talks_only_to_its_ring_neighbours(seen, ctx):
    """Each rank sends to one neighbour and receives from the other, as in a ring.
    Property: only ring neighbours; against the reference (the exercise's rule, read from the
    recorded calls: sends to rank + 1 and receives from rank - 1, or the other way round)."""
    with charged_by(SUMS):
        records = list(ring_records(seen))
    for n, rank, _i, record in records:
        sent = {c["peer"] for c in record["calls"] if c["name"] in ("send", "isend")}
        got = {c["peer"] for c in record["calls"] if c["name"] in ("recv", "irecv")}
        right, left = (rank + 1) % n, (rank - 1) % n
        ring = (sent <= {right} and got <= {left}) or (sent <= {left} and got <= {right})
        expect(
            ring,
            _(
                "with {n} processes, rank {rank} sent to {sent} and received from {got}; its "
                "ring neighbours are {left} and {right}"
            ).format(n=n, rank=rank, sent=sorted(sent), got=sorted(got), left=left, right=right),
        )


@check_on(
    random_tensors,
    points=1,
    hint="Send chunks of 1/world_size of the tensor, not the whole tensor: 2 (N - 1) chunks "
    "per rank in all, N - 1 in the reduce-scatter and N - 1 in the all-gather.",
)
def each_rank_sends_two_n_minus_one_chunks(seen, ctx):
    """Each rank sends 2 (N - 1) / N of the tensor's elements: what makes the ring fast.
    Property: the amount sent; against the reference (2 (N - 1) / N of the tensor's elements, read
    from the recorded sends)."""
    with charged_by(SUMS):
        records = list(ring_records(seen))
    for n, rank, i, record in records:
        numel = record["expected"].numel()
        sent = sum(c.get("numel", 0) for c in record["calls"] if c["name"] in ("send", "isend"))
        budget = 2 * (n - 1) * numel // n
        expect(
            sent <= budget,
            _(
                "with {n} processes, rank {rank} sent {sent} elements of a tensor of {numel} "
                "(call {number}); a ring sends {budget}, 2 (N - 1) / N of it"
            ).format(n=n, rank=rank, sent=sent, numel=numel, number=i + 1, budget=budget),
        )


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
