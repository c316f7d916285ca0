"""Hidden checks of `split_batch`: random batches judged against the reference solution."""

import torch

from grader.api import _, check, expect, expect_equal
from grader.checks.split_batch import given_batches, pair_of


def random_batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Return four (X, y, number of devices) with 2 to 40 rows over 2 to 4 devices."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _batch in range(4):
        rows = int(torch.randint(2, 41, (1,), generator=gen))
        k = int(torch.randint(2, 5, (1,), generator=gen))
        batches.append(
            (torch.randn(rows, 3, generator=gen), torch.randint(0, 10, (rows,), generator=gen), k)
        )
    return batches


random_batches_over_devices = given_batches.using(
    "random_batches_over_devices",
    "Four random batches of 2 to 40 rows over 2 to 4 devices.",
    batches=lambda ctx: random_batches(ctx.seed),
)


@check(
    random_batches_over_devices,
    points=2,
    hint="Split both X and y with torch.chunk's sizes, in order, one shard per device.",
)
def matches_the_reference_on_random_batches(seen, ctx):
    """On random batches, the shards are those of the reference split_batch."""
    for (X, y, k), result in zip(random_batches(ctx.seed), seen, strict=True):
        xs, ys = pair_of(result)
        want_x, want_y = ctx.reference["split_batch"](X, y, [torch.device("cpu")] * k)
        expect(
            len(xs) == len(want_x),
            _("{rows} rows over {k} devices gave {got} shards, expected {wanted}").format(
                rows=len(X), k=k, got=len(xs), wanted=len(want_x)
            ),
        )
        for i, (a, b, c, d) in enumerate(zip(xs, want_x, ys, want_y, strict=True)):
            where = {"rows": len(X), "k": k, "i": i}
            expect_equal(a, b, _("{rows} rows over {k} devices, X shard {i}").format(**where))
            expect_equal(c, d, _("{rows} rows over {k} devices, y shard {i}").format(**where))
