"""Known wrong versions of `average_gradients_bucketed`, from one template of a right one."""

from grader.exercises.catalogue import Mistake, variant

TEMPLATE = """
def average_gradients_bucketed(model, bucket_mb=25):
    world = dist.get_world_size()
    limit = bucket_mb * 2**20
    grads = [p.grad for p in <<ORDER>> if p.grad is not None]
    buckets, bucket, size = [], [], 0
    for grad in grads:
        nbytes = grad.numel() * grad.element_size()
        if bucket and <<FULL>>:
            buckets.append(bucket)
            bucket, size = [], 0
        bucket.append(grad)
        size += nbytes
    <<LAST>>
    for bucket in buckets:
        flat = torch.cat([g.flatten() for g in bucket])
        dist.all_reduce(flat)
        <<DIVIDE>>
        offset = 0
        for grad in bucket:
            <<BACK>>
            offset += grad.numel()
"""

RIGHT = {
    "ORDER": "reversed(list(model.parameters()))",
    "FULL": "size + nbytes > limit",
    "LAST": "if bucket:\n        buckets.append(bucket)",
    "DIVIDE": "flat /= world",
    "BACK": "grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))",
}

forgets_the_last_bucket = Mistake(
    source=variant(TEMPLATE, RIGHT, LAST=""),
    fails="gradients_are_the_mean_over_ranks",  # with one bucket, the only one is left out
    hint_mentions="copy every slice back",
)

never_writes_the_bucket_back = Mistake(
    source=variant(TEMPLATE, RIGHT, BACK="grad = flat[offset:offset + grad.numel()].view_as(grad)"),
    fails="gradients_are_the_mean_over_ranks",
    hint_mentions="copy every slice back",
)

sums_without_dividing = Mistake(
    source=variant(TEMPLATE, RIGHT, DIVIDE=""),
    fails="gradients_are_the_mean_over_ranks",
    hint_mentions="divide each by",
)

one_bucket_per_parameter = Mistake(
    source=variant(TEMPLATE, RIGHT, FULL="True"),
    fails="one_all_reduce_per_bucket",
    hint_mentions="not one per parameter",
)

forward_order = Mistake(
    source=variant(TEMPLATE, RIGHT, ORDER="model.parameters()"),
    fails="buckets_start_from_the_last_parameter",
    hint_mentions="reverse",
)

bucket_size_in_megabits = Mistake(
    source=variant(TEMPLATE, RIGHT, FULL="size + nbytes > bucket_mb * 2**20 * 8"),
    fails="no_bucket_over_the_limit",  # too few calls follow from buckets too big
    hint_mentions="bucket_mb * 2**20 bytes",
)

closes_a_bucket_once_it_is_over_the_limit = Mistake(
    source=variant(TEMPLATE, RIGHT, FULL="size > limit"),
    fails="no_bucket_over_the_limit",
    hint_mentions="would take the current one past",
)
