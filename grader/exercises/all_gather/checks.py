"""Public checks of `all_gather(shard, numel)`: every rank gets back the flat tensor of `numel`
values whose chunks (tensor_split into world_size) the ranks hold, passed around a ring with
point-to-point sends and receives.

Each case runs in groups of 2, 3 and 4 processes (grader.ranks). Every rank knows the same
tensor, passes in its own chunk of it and must get the whole back; the calls are recorded on
the way. The machinery is reduce_scatter's (grader.exercises.reduce_scatter.checks).
"""

import torch

from grader.api import N_, _, case, check_on, error_hints
from grader.exercises.reduce_scatter.checks import (
    P2P_HINT,
    SIZE_HINT,
    expect_exact_dtypes,
    expect_halves,
    expect_ring_steps,
    plain,
    run_half,
)
from grader.exercises.ring_allreduce.checks import each_kind, expect_point_to_point

GATHER_HINT = N_(
    "Make a flat tensor of numel values (of the shard's dtype), put your shard in chunk rank "
    "of its tensor_split(world_size), and pass the chunks round the ring: in step s, send "
    "chunk (rank - s) to rank + 1 and receive chunk (rank - s - 1) from rank - 1, copying."
)
MISPLACED_HINT = N_(
    "Every value arrived, in the wrong places: chunk r of the result must be rank r's shard, "
    "where tensor_split(world_size) puts it. Check the chunk each step sends and receives."
)


@case
def book_demo(student, ctx):
    """The book's demo cut in two: rank 0 holds [1.], rank 1 [1.] of [[1., 1.]]."""
    return run_half(student, ctx, "book", "all_gather", sizes=(2,))


@case
def random_tensors(student, ctx):
    """Four random float32 tensors (1-D to 3-D), with lengths that 2, 3 and 4 divide."""
    return run_half(student, ctx, "random", "all_gather")


@case
def lengths_that_do_not_divide(student, ctx):
    """Tensors of 7, 13, 1, 2 and 3 elements: chunks of unequal length, and empty ones."""
    return run_half(student, ctx, "uneven", "all_gather")


@case
def integers_and_float64(student, ctx):
    """int64 values up to 2**40 and int32 tensors, the same values in float64, and a float64
    tensor, of lengths that 2, 3 and 4 divide."""
    return run_half(student, ctx, "exact", "all_gather")


@case
def given_kinds(student, ctx, kinds: list[str]):
    """Tensors the grader describes ("given:<dtype>:<shape>"), one call each."""
    return each_kind(kinds, lambda kind: run_half(student, ctx, kind, "all_gather"))


def gather_hint(n, rank, i, record, ranks):
    """Name values that all arrived in the wrong order."""
    got, expected = plain(record["returned"]), record["expected"]
    if isinstance(got, torch.Tensor) and got.numel() == expected.numel() and got.numel() > 1:
        same = torch.equal(got.reshape(-1).sort().values, expected.sort().values.to(got.dtype))
        if same and not torch.equal(got.reshape(-1), expected.to(got.dtype)):
            return MISPLACED_HINT
    return None


MAIN = "every_rank_gets_the_whole_tensor"  # the other value checks defer to it where it fails too


@check_on(book_demo, points=2, hint="Both ranks must get [1., 1.] back. " + GATHER_HINT)
def book_demo_gives_both_ranks_the_whole(seen, ctx):
    """[1.] on rank 0 and [1.] on rank 1: both get [1., 1.].
    Property: the book's demo; against the reference (its known result), a failure that random
    tensors show too being every_rank_gets_the_whole_tensor's."""
    expect_halves(seen, N_("the book's demo"), gather_hint, see=MAIN)


@check_on(random_tensors, points=3, hint=GATHER_HINT)
def every_rank_gets_the_whole_tensor(seen, ctx):
    """In groups of 2, 3 and 4, every rank gets the whole flat tensor, its chunks in rank
    order.
    Property: the whole tensor on every rank; against the reference, the one check that compares
    it."""
    expect_halves(seen, N_("random float32"), gather_hint)


@check_on(
    lengths_that_do_not_divide,
    points=2,
    hint="The chunks are those of torch.empty(numel).tensor_split(world_size): the first ones "
    "one value longer when world_size does not divide numel, some empty when there are fewer "
    "values than ranks; skip sending and receiving an empty chunk.",
)
def works_for_any_length(seen, ctx):
    """Lengths of 7, 13, 1, 2 and 3 elements gather right in groups of 2, 3 and 4.
    Property: chunks of any length; against the reference, left to
    every_rank_gets_the_whole_tensor where it fails too (no relation: padding changes the
    chunks)."""
    expect_halves(seen, N_("a length that the world size does not divide"), gather_hint, see=MAIN)


@check_on(
    integers_and_float64,
    points=1,
    hint="Make the result with the shard's dtype (torch.empty(numel, dtype=shard.dtype)): "
    "integers must come back exactly.",
)
def keeps_dtypes_and_integers_exact(seen, ctx):
    """int64 (up to 2**40) and int32 chunks come back exactly, as the same values do in
    float64, and every result keeps its dtype.
    Property: dtypes kept and integers exact; a relation: each integer result against the code's
    own float64 result on the same values, on lengths every group size divides, so blind to
    chunk boundaries; then the exact values, which float32 may have rounded in both, against the
    reference, left to the values check where it fails too."""
    expect_exact_dtypes(seen, N_("int64, int32 and float64"), MAIN)


@check_on(random_tensors, points=2, hint=P2P_HINT)
def uses_only_point_to_point_calls(seen, ctx):
    """No collective is called at all: the all-gather is built from sends and receives.
    Property: no collective; against the reference (the calls the exercise allows), read from
    the recorded calls whatever the result."""
    expect_point_to_point(seen)


@check_on(random_tensors, points=1, hint=SIZE_HINT)
def exchanges_one_chunk_per_step_with_its_neighbours(seen, ctx):
    """Each rank sends only to one ring neighbour and receives only from the other: N - 1
    chunks of 1/N of the tensor, (N - 1) / N of it.
    Property: a ring between neighbours, one chunk a step; against the reference (the ring the
    exercise states), read from the recorded sends and receives whatever the result, so no gate."""
    expect_ring_steps(seen, MAIN)


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "Received data size doesn't match" in raised.message or "preamble" in raised.message:
        return _(
            "A receive got a different number of elements, or of bytes, than it expected: both "
            "ends of a step must agree on the chunk (those of tensor_split(world_size), which "
            "differ by one value when world_size does not divide numel), and the result must "
            "have the shard's dtype."
        )
    if "Default process group has not been initialized" in raised.message:
        return _("Call the function inside a process group: use d2l.launch(...) in the notebook.")
    return None
