"""Hidden checks of `split_batch`: random batches judged against the reference solution."""

import torch

from grader.api import Crash, Fail, _, check_on, expect, expect_equal, raised_in
from grader.exercises.split_batch.checks import expect_sizes, given_batches, pair_of


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


@check_on(
    random_batches_over_devices,
    points=2,
    hint="Split X and y alike, in order, one shard per device, with torch.chunk's sizes or "
    "sizes as even as can be.",
)
def matches_the_reference_on_random_batches(seen, ctx):
    """On random batches over 2 to 4 devices, the X and y shards are the reference
    split_batch's, or the batch's rows cut at the same places where the shards are as even as
    can be.
    Property: the split of any batch; against the reference (the reference split_batch's
    shards; where the code cuts as evenly as can be instead, which the exercise allows, the
    batch's rows cut at the same places, X and y alike)."""
    # A difference has the cause of the public check that judges it on the numbered batches
    # (the shards' sizes, the order of the rows, the labels), which it names: it charges only
    # where that check passed. A refused batch is the sizes' cause too.
    if all(raised_in(r) is not None for r in seen):
        sizes = "shard_sizes_follow_torch_chunk"  # which charges the error where it saw it
        raise Crash(raised_in(seen[0]), every_call=True, calls=len(seen), see=sizes)
    for (X, y, k), call in zip(random_batches(ctx.seed), seen, strict=True):
        crash = raised_in(call)
        if crash is not None:
            raise Fail(
                _("{rows} rows over {k} devices: split_batch raised {error}: {message}").format(
                    rows=len(X), k=k, error=crash.type, message=crash.message
                ),
                see="shard_sizes_follow_torch_chunk",
            )
        xs, ys = pair_of(call.returned)
        sizes = [x.shape[0] if x.shape else 0 for x in xs]
        expect_sizes(sizes, len(X), k, see="shard_sizes_follow_torch_chunk")
        want_x, want_y = ctx.reference["split_batch"](X, y, [torch.device("cpu")] * k)
        if sizes != [len(w) for w in want_x]:  # even sizes, which the exercise allows too
            want_x, want_y = X.split(sizes), y.split(sizes)
        expect(
            len(ys) == len(xs),
            _("{rows} rows over {k} devices: {xs} X shards but {ys} y shards").format(
                rows=len(X), k=k, xs=len(xs), ys=len(ys)
            ),
            see="labels_stay_with_their_examples",
        )
        for i, (a, b, c, d) in enumerate(zip(xs, want_x, ys, want_y, strict=True)):
            where = {"rows": len(X), "k": k, "i": i}
            expect_equal(
                a,
                b,
                _("{rows} rows over {k} devices, X shard {i}").format(**where),
                see="shards_keep_the_row_order",
            )
            expect_equal(
                c,
                d,
                _("{rows} rows over {k} devices, y shard {i}").format(**where),
                see="labels_stay_with_their_examples",
            )
