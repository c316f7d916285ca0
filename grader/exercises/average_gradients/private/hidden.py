"""Hidden checks of `average_gradients`: another network and batch, from another seed."""

from grader.api import charged_by, check_on
from grader.exercises.average_gradients.checks import (
    MEAN,
    MEAN_HINT,
    expect_mean_gradients,
    gradients_of_a_shard,
)

another_batch = gradients_of_a_shard.using(
    "another_batch", "The same case under another name, so with other weights and inputs."
)


@check_on(another_batch, points=2, hint=MEAN_HINT)
def gradients_are_the_mean_on_another_batch(seen, ctx):
    """With other weights and another batch, the gradients are still the whole batch's.
    Property: the mean gradients on weights and inputs the public checks never gave; against the
    reference (one process's gradients on that whole batch)."""
    with charged_by(MEAN):  # wrong on the public batch too: charged there
        expect_mean_gradients(seen, ctx)
