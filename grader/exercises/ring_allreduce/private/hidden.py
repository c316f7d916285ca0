"""Hidden checks of `ring_allreduce`: tensors of random shapes and dtypes, in groups of 2 to
4, against torch.distributed.all_reduce of the same tensors."""

import torch

from grader.api import check
from grader.exercises.ring_allreduce.checks import RING_HINT, expect_sums, given_kinds

DTYPES = ["float32", "float64", "int64", "int32"]  # what gloo sums


def random_kinds(seed: int) -> list[str]:
    """Return three tensor descriptions ("given:<dtype>:<shape>") drawn from the seed."""
    gen = torch.Generator().manual_seed(seed)
    kinds = []
    for _ in range(3):
        dims = torch.randint(1, 9, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen)
        dtype = DTYPES[int(torch.randint(0, len(DTYPES), (1,), generator=gen))]
        kinds.append(f"given:{dtype}:{'x'.join(str(int(d)) for d in dims)}")
    return kinds


random_shapes_and_dtypes = given_kinds.using(
    "random_shapes_and_dtypes",
    "Three tensors of random shape and dtype, each in groups of 2, 3 and 4.",
    kinds=lambda ctx: random_kinds(ctx.seed),
)


@check(random_shapes_and_dtypes, points=2, hint=RING_HINT)
def matches_all_reduce_on_random_tensors(seen, ctx):
    """On random shapes and dtypes, every rank holds what dist.all_reduce gives."""
    for kind, groups in zip(random_kinds(ctx.seed), seen, strict=False):
        expect_sums(groups, ctx, kind, kind.removeprefix("given:"))
