"""Known wrong versions of `train_batch`: the book's version with one part changed."""

from grader.exercises.catalogue import Mistake, variant

BOOK = """
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    ls = [loss(lenet(X_shard, device_W), y_shard).<<REDUCTION>>()
          for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)]
<<BACKWARD>>
<<ALL_REDUCE>>
<<UPDATE>>
"""
RIGHT = {
    "REDUCTION": "sum",
    "BACKWARD": "    for l in ls:\n        l.backward()",
    "ALL_REDUCE": (
        "    with torch.no_grad():\n        for i in range(len(device_params[0])):\n"
        "            allreduce([device_params[c][i].grad for c in range(len(devices))])"
    ),
    "UPDATE": "    for param in device_params:\n        d2l.sgd(param, lr, X.shape[0])",
}

forgets_backward = Mistake(
    source=variant(BOOK, RIGHT, BACKWARD=""),
    fails="every_replica_matches_one_sgd_step",
    hint_mentions="call .backward()",
    seen_in="seed notes: the backward loop was forgotten",
)

forgets_allreduce = Mistake(
    source=variant(BOOK, RIGHT, ALL_REDUCE=""),
    fails="every_replica_matches_one_sgd_step",
    hint_mentions="all-reduce every parameter's gradients",
)

divides_by_the_shard_size = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        UPDATE=(
            "    for param, X_shard in zip(device_params, X_shards):\n"
            "        d2l.sgd(param, lr, X_shard.shape[0])"
        ),
    ),
    fails="every_replica_matches_one_sgd_step",
    hint_mentions="divide by the whole batch size",
    hints_never=("not just two",),
)

averages_the_loss = Mistake(
    source=variant(BOOK, RIGHT, REDUCTION="mean"),
    fails="every_replica_matches_one_sgd_step",
    hint_mentions="sum the per-example losses",
)

updates_only_two_replicas = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        UPDATE="    for param in device_params[:2]:\n        d2l.sgd(param, lr, X.shape[0])",
    ),
    fails="four_devices_step_as_two_do",
    hint_mentions="Loop over all devices, not just two",
    seen_in="a loop written for the book's two GPUs",
)

averages_the_per_device_means = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        REDUCTION="mean",
        UPDATE="    for param in device_params:\n        d2l.sgd(param, lr, len(devices))",
    ),
    fails="uneven_split_steps_as_one_device_does",
    hint_mentions="right only when the shards are equal",
    hints_never=("not just two",),
    seen_in="DistributedDataParallel's habit: each device's mean loss, gradients averaged over "
    "the devices; right on equal shards only",
)

sums_over_two_devices = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        ALL_REDUCE=(
            "    with torch.no_grad():\n        for i in range(len(device_params[0])):\n"
            "            allreduce([device_params[c][i].grad for c in range(2)])"
        ),
    ),
    fails="four_devices_step_as_two_do",
    hint_mentions="fixed to two devices",
    hints_never=("not just two",),
    seen_in="a loop written for the book's two GPUs, in the all-reduce only",
)

never_zeroes_the_gradients = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        UPDATE=(
            "    with torch.no_grad():\n        for param in device_params:\n"
            "            for p in param:\n                p -= lr * p.grad / X.shape[0]"
        ),
    ),
    fails="nothing_carries_over_between_steps",
    hint_mentions="Zero the gradients once they have been used",
)
