"""Hidden checks of `ShardedOptimizer`: a network whose first layer is frozen."""

from grader.api import check_on
from grader.exercises.sharded_optimizer.checks import (
    STEP_HINT,
    expect_one_process_weights,
    training_steps,
)

with_a_frozen_layer = training_steps.using(
    "with_a_frozen_layer",
    "The same steps with the network's first layer frozen (no gradient, no state).",
    frozen=True,
)


@check_on(with_a_frozen_layer, points=2, hint=STEP_HINT)
def shards_only_the_parameters_that_train(seen, ctx):
    """With the first layer frozen, the others still train as in one process, and the frozen
    one keeps its weights.
    Property: a frozen layer is left out; against the reference, a step wrong without a frozen
    layer too being weights_match_one_process's."""
    expect_one_process_weights(seen, ctx, frozen=True, see="weights_match_one_process")
