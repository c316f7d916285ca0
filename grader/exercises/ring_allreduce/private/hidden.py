"""Hidden checks of `ring_allreduce`: tensors of random shapes and dtypes, in groups of 2 to
4, against torch.distributed.all_reduce of the same tensors."""

import math

import torch

from grader.api import SeenTensor, charged_by, check_on
from grader.exercises.ring_allreduce.checks import (
    RING_HINT,
    SUMS,
    expect_sums,
    given_kinds,
)

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


@check_on(random_shapes_and_dtypes, points=2, hint=RING_HINT)
def matches_all_reduce_on_random_tensors(seen, ctx):
    """On random shapes and dtypes, every rank holds what dist.all_reduce gives.
    Property: random shapes and dtypes, for code fitted to the public inputs; against the
    reference (dist.all_reduce of the same tensors)."""
    for kind, groups in zip(random_kinds(ctx.seed), seen, strict=False):
        with charged_by(public_owner(kind, groups)):
            expect_sums(groups, ctx, kind, kind.removeprefix("given:"))


def public_owner(kind: str, groups: list[dict]) -> str:
    """Return the public check that judges what went wrong on a kind of tensor: a dtype
    other than float32 that came back in another dtype, or that raised or stopped (a length
    alone makes float32 fail as well); else a length that some group size does not divide;
    else the sum itself."""
    _, dtype, dims = kind.split(":")
    numel = math.prod(int(d) for d in dims.split("x"))
    uneven = any(numel % n for n in (2, 3, 4))
    kept = kept_dtypes(groups)
    if dtype != "float32" and not kept:
        return "keeps_dtypes_and_sums_integers_exactly"
    return "sums_tensors_of_any_length" if uneven else SUMS


def kept_dtypes(groups: list[dict]) -> bool | None:
    """Return False when a tensor came back in another dtype than its input's, None when a
    group did not finish or a rank raised (nothing to tell), else True."""
    for group in groups:
        ranks = group.get("ranks")
        if "failed" in group or ranks is None:
            return None
        for rank in ranks:
            if rank.get("raised") is not None:
                return None
            for record in rank["records"]:
                given, expected = record["given"], record["expected"]
                given = given.value if isinstance(given, SeenTensor) else given
                expected = expected.value if isinstance(expected, SeenTensor) else expected
                if isinstance(given, torch.Tensor) and given.dtype != expected.dtype:
                    return False
    return True
