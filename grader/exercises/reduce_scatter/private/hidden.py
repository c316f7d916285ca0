"""Hidden checks of `reduce_scatter`: tensors of random shapes and dtypes, in groups of 2
to 4, against torch.distributed.all_reduce of the same tensors."""

from grader.api import check_on
from grader.exercises.reduce_scatter.checks import HALF_HINT, expect_random_kind, given_kinds
from grader.exercises.ring_allreduce.private.hidden import random_kinds

random_shapes_and_dtypes = given_kinds.using(
    "random_shapes_and_dtypes",
    "Three tensors of random shape and dtype, each in groups of 2, 3 and 4.",
    kinds=lambda ctx: random_kinds(ctx.seed),
)


@check_on(random_shapes_and_dtypes, points=2, hint=HALF_HINT)
def reduces_random_tensors(seen, ctx):
    """On random shapes and dtypes, every rank gets its chunk of dist.all_reduce's sum.
    Property: random shapes and dtypes, for code fitted to the public inputs; against the
    reference, a failure of a kind a public check judges too (a length, a dtype, the values)
    being left to it."""
    checks = {
        "main": "each_rank_gets_its_chunk_of_the_sum",
        "length": "works_for_any_length",
        "dtype": "keeps_dtypes_and_sums_integers_exactly",
    }
    for kind, groups in zip(random_kinds(ctx.seed), seen, strict=False):
        expect_random_kind(groups, kind, checks)
