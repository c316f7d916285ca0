"""Known wrong versions of `train_batch`."""

from grader.mistakes import Mistake

forgets_backward = Mistake(
    source="""
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    ls = [loss(lenet(X_shard, device_W), y_shard).sum()
          for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)]
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])
""",
    fails="every_replica_matches_one_sgd_step",
    hint_mentions="call .backward()",
    seen_in="seed notes: the backward loop was forgotten",
)

forgets_allreduce = Mistake(
    source="""
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params):
        loss(lenet(X_shard, device_W), y_shard).sum().backward()
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])
""",
    fails="every_replica_matches_one_sgd_step",
    hint_mentions="all-reduce every parameter's gradients",
)

divides_by_the_shard_size = Mistake(
    source="""
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params):
        loss(lenet(X_shard, device_W), y_shard).sum().backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    for param, X_shard in zip(device_params, X_shards):
        d2l.sgd(param, lr, X_shard.shape[0])
""",
    fails="every_replica_matches_one_sgd_step",
    hint_mentions="divide by the whole batch size",
)

averages_the_loss = Mistake(
    source="""
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params):
        loss(lenet(X_shard, device_W), y_shard).mean().backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])
""",
    fails="uneven_split_matches_one_sgd_step",
    hint_mentions="sum the per-example losses",
)

never_zeroes_the_gradients = Mistake(
    source="""
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params):
        loss(lenet(X_shard, device_W), y_shard).sum().backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
        for param in device_params:
            for p in param:
                p -= lr * p.grad / X.shape[0]
""",
    fails="two_steps_match_two_sgd_steps",
    hint_mentions="zero the gradients after each update",
)
