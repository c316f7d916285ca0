"""Hidden checks of `all_gather`: tensors of random shapes and dtypes, in groups of 2 to 4."""

from grader.api import check_on
from grader.exercises.all_gather.checks import GATHER_HINT, given_kinds
from grader.exercises.reduce_scatter.checks import expect_random_kind
from grader.exercises.ring_allreduce.private.hidden import random_kinds

random_shapes_and_dtypes = given_kinds.using(
    "random_shapes_and_dtypes",
    "Three tensors of random shape and dtype, each in groups of 2, 3 and 4.",
    kinds=lambda ctx: random_kinds(ctx.seed),
)


@check_on(random_shapes_and_dtypes, points=2, hint=GATHER_HINT)
def gathers_random_tensors(seen, ctx):
    """On random shapes and dtypes, every rank gets the whole tensor back.
    Property: random shapes and dtypes, for code fitted to the public inputs; against the
    reference, a failure of a kind a public check judges too (a length, a dtype, the values)
    being left to it."""
    checks = {
        "main": "every_rank_gets_the_whole_tensor",
        "length": "works_for_any_length",
        "dtype": "keeps_dtypes_and_integers_exact",
    }
    for kind, groups in zip(random_kinds(ctx.seed), seen, strict=False):
        expect_random_kind(groups, kind, checks)
