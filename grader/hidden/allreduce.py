"""Hidden checks of `allreduce`: random lists judged against the reference solution."""

import torch

from grader.api import _, check, expect_close, expect_equal
from grader.checks.allreduce import REBIND_HINT, all_finished, given_lists, rebound

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int16]


def random_lists(seed: int) -> list[list[torch.Tensor]]:
    """Return five lists of 2 to 8 tensors, each list with a random shape and dtype."""
    gen = torch.Generator().manual_seed(seed)
    lists = []
    for _list in range(5):
        k = int(torch.randint(2, 9, (1,), generator=gen))
        shape = tuple(
            int(s)
            for s in torch.randint(
                1, 5, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen
            )
        )
        dtype = DTYPES[int(torch.randint(0, len(DTYPES), (1,), generator=gen))]
        if dtype.is_floating_point:
            lists.append([torch.randn(shape, generator=gen, dtype=dtype) for _ in range(k)])
        else:
            lists.append(
                [torch.randint(-99, 99, shape, generator=gen, dtype=dtype) for _ in range(k)]
            )
    return lists


random_lists_of_tensors = given_lists.using(
    "random_lists_of_tensors",
    "Five lists of random length, shape and dtype, spread over the devices.",
    lists=lambda ctx: random_lists(ctx.seed),
)


@check(
    random_lists_of_tensors,
    points=2,
    hint="Every tensor given must end holding the sum of all of them, in its own dtype.",
)
def matches_the_reference_on_random_lists(seen, ctx):
    """On random lists, the tensors given hold what the reference allreduce gives."""
    all_finished(seen)
    for ts, outcome in zip(random_lists(ctx.seed), seen, strict=True):
        expected = [t.clone() for t in ts]
        ctx.reference["allreduce"](expected)
        what = _("{count} {dtype} tensors of shape {shape}").format(
            count=len(ts), dtype=ts[0].dtype, shape=tuple(ts[0].shape)
        )
        hint = REBIND_HINT if rebound(outcome) else None
        for i, (t, e) in enumerate(zip(outcome["given"], expected, strict=True)):
            label = _("{what}: tensor {i}").format(what=what, i=i)
            if e.is_floating_point():
                expect_close(t, e, label, hint, rtol=1e-5, atol=1e-5)
            else:
                expect_equal(t, e, label, hint)
