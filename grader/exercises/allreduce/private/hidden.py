"""Hidden checks of `allreduce`: random lists judged against the reference solution."""

import torch

from grader.api import SeenTensor, _, all_finished, check_on, expect_close, expect_equal
from grader.exercises.allreduce.checks import (
    REBIND_HINT,
    did_the_work,
    given_lists,
    rebound,
)

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


@check_on(
    random_lists_of_tensors,
    points=2,
    hint="Every tensor given must end holding the sum of all of them, in its own dtype.",
)
def matches_the_reference_on_random_lists(seen, ctx):
    """On random lists, the tensors given hold what the reference allreduce gives.
    Property: the sum of any list; against the reference allreduce."""
    # A difference has the cause of the public check that judges it on other lists (new
    # tensors put into the list, another dtype's sum, a wrong sum), which it names: it
    # charges only where that check passed.
    all_finished(seen)
    for ts, outcome in zip(random_lists(ctx.seed), seen, strict=True):
        expected = [t.clone() for t in ts]
        ctx.reference["allreduce"](expected)
        what = _("{count} {dtype} tensors of shape {shape}").format(
            count=len(ts), dtype=ts[0].dtype, shape=tuple(ts[0].shape)
        )
        hint, see = (
            (REBIND_HINT, "writes_into_the_tensors_it_was_given")
            if rebound(outcome)
            else (None, None)
        )
        work = did_the_work(outcome, ts)  # a slip in code that sums: a public check's cause
        for i, (t, e) in enumerate(zip(outcome["given"], expected, strict=True)):
            label = _("{what}: tensor {i}").format(what=what, i=i)
            owner = see or (cause_of(t, e) if work else None)
            if e.is_floating_point():
                expect_close(t, e, label, hint, rtol=1e-5, atol=1e-5, see=owner)
            else:
                expect_equal(t, e, label, hint, see=owner)


def cause_of(value, expected: torch.Tensor) -> str:
    """Return the public check that judges the difference between `value` and the reference's
    `expected`: another dtype, or integers off by float32's rounding, are
    keeps_dtypes_and_sums_integers_exactly's; any other wrong sum, every_tensor_holds_the_sum's."""
    got = value.value if isinstance(value, SeenTensor) else value
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return "every_tensor_holds_the_sum"
    if got.dtype != expected.dtype:
        return "keeps_dtypes_and_sums_integers_exactly"
    if not expected.is_floating_point() and torch.allclose(
        got.double(), expected.double(), rtol=1e-6, atol=1.0
    ):
        return "keeps_dtypes_and_sums_integers_exactly"
    return "every_tensor_holds_the_sum"
