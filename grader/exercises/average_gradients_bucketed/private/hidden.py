"""Hidden checks of `average_gradients_bucketed`: another bucket size."""

from grader.api import _, charged_by, check_on, expect, groups_finished
from grader.exercises.average_gradients.checks import gradients_of_a_shard
from grader.exercises.average_gradients_bucketed.checks import (
    BUCKET_HINT,
    SMALL_MEAN,
    expect_mean_with_buckets,
    expected_buckets,
    reduced,
)

OTHER_MB = 0.002

other_buckets = gradients_of_a_shard.using(
    "other_buckets",
    "The shard's gradients with bucket_mb=0.002.",
    arguments={"bucket_mb": OTHER_MB},
)


@check_on(other_buckets, points=2, hint=BUCKET_HINT)
def right_means_and_bucket_count_with_another_size(seen, ctx):
    """With bucket_mb=0.002, the means are right and each bucket has one all_reduce.
    Property: another bucket size; against the reference (one process's gradients, and the buckets
    that bucket_mb=0.002 makes)."""
    with charged_by(SMALL_MEAN):  # wrong with the public sizes too: charged there
        expect_mean_with_buckets(seen, ctx)
    wanted = len(expected_buckets(False, OTHER_MB))
    for n, ranks in groups_finished(seen):
        for rank, result in enumerate(ranks):
            count = len(reduced(result))
            expect(
                count == wanted,
                _(
                    "with {n} processes, rank {rank} called all_reduce {count} times; "
                    "bucket_mb={bucket_mb} makes {wanted} buckets"
                ).format(n=n, rank=rank, count=count, bucket_mb=OTHER_MB, wanted=wanted),
                # the public checks judge these causes: too many calls, or buckets too big
                see="one_all_reduce_per_bucket" if count > wanted else "no_bucket_over_the_limit",
            )
