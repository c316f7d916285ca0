"""Hidden checks of `average_gradients`: another network and batch, from another seed."""

from grader.api import check
from grader.exercises.average_gradients.checks import (
    MEAN_HINT,
    expect_mean_gradients,
    gradients_of_a_shard,
)

another_batch = gradients_of_a_shard.using(
    "another_batch", "The same case under another name, so with other weights and inputs."
)


@check(another_batch, points=2, hint=MEAN_HINT)
def gradients_are_the_mean_on_another_batch(seen, ctx):
    """With other weights and another batch, the gradients are still the whole batch's."""
    expect_mean_gradients(seen, ctx)
