"""Hidden checks of `memory_per_rank`: an optimizer with three values of state per value,
a float64 network, and groups of 5 and 8 ranks."""

import torch

from grader.api import check_on
from grader.exercises.memory_per_rank.checks import TABLE_HINT, every_stage, expect_stage

amsgrad_in_float64 = every_stage.using(
    "amsgrad_in_float64",
    "Adam with amsgrad (three values of state per value) on a float64 network, over 5 and 8 ranks.",
    optimizers=("Adam with amsgrad",),
    dtype="float64",
    sizes=(5, 8),
)


@check_on(amsgrad_in_float64, points=2, hint=TABLE_HINT)
def reads_the_state_and_the_bytes_from_what_it_is_given(seen, ctx):
    """With three values of state per value and 8 bytes a value, every stage still matches the
    table.
    Property: K and the bytes come from what the function is given; against the reference for
    DDP's figure, and through the relation with the code's own chunk (own_chunk) for the sharded
    stages."""
    for stage in (0, 1, 2, 3):
        expect_stage(
            seen,
            ctx,
            stage,
            "reads_the_state_and_the_bytes_from_what_it_is_given",
            dtype=torch.float64,
            sizes=(5, 8),
        )
