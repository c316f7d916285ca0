"""Hidden checks of `reduce_scatter`: tensors of random shapes and dtypes, in groups of 2
to 4, against torch.distributed.all_reduce of the same tensors."""

from grader.api import check
from grader.exercises.reduce_scatter.checks import HALF_HINT, expect_halves, given_kinds
from grader.exercises.ring_allreduce.private.hidden import random_kinds

random_shapes_and_dtypes = given_kinds.using(
    "random_shapes_and_dtypes",
    "Three tensors of random shape and dtype, each in groups of 2, 3 and 4.",
    kinds=lambda ctx: random_kinds(ctx.seed),
)


@check(random_shapes_and_dtypes, points=2, hint=HALF_HINT)
def reduces_random_tensors(seen, ctx):
    """On random shapes and dtypes, every rank gets its chunk of dist.all_reduce's sum."""
    for kind, groups in zip(random_kinds(ctx.seed), seen, strict=False):
        expect_halves(groups, kind.removeprefix("given:"))
