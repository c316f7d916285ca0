"""Hidden checks of `evaluate_accuracy_distributed`: shards of very different sizes."""

from grader.api import charged_by, check_on
from grader.exercises.evaluate_accuracy_distributed.checks import (
    COUNT_HINT,
    WHOLE_SET,
    expect_accuracy,
    shards,
)

skewed_shards = shards.using(
    "skewed_shards", "Rank 0 has one example, the others 14 or more each.", shape="skewed"
)


@check_on(skewed_shards, points=2, hint=COUNT_HINT)
def skewed_shards_give_the_accuracy_of_the_whole_set(seen, ctx):
    """With one example on rank 0 and many elsewhere, the accuracy is still counted.
    Property: shards of very different sizes; against the reference (the accuracy counted across
    every shard)."""
    with charged_by(WHOLE_SET):  # wrong on the public shards too: charged there
        expect_accuracy(seen, ctx, "skewed")
