"""Known wrong versions of `train_ddp`, from one template of a right one."""

from grader.exercises.catalogue import Mistake, variant

TEMPLATE = """
def train_ddp(net, num_epochs, batch_size, lr, data=None, device=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set, test_set = data if data is not None else d2l.fashion_mnist_datasets()
    device = device if device is not None else d2l.local_device()

    def init_weights(module):
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(module.weight, std=0.01)

    <<WRAP>>
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True)
    <<TRAIN_ITER>>
    test_iter = DataLoader(Subset(test_set, range(rank, len(test_set), world)), batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr)
    loss = nn.CrossEntropyLoss()
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        <<SET_EPOCH>>
        model.train()
        timer.start()
        for X, y in train_iter:
            X, y = X.to(device), y.to(device)
            optimizer.zero_grad()
            <<STEP>>
            optimizer.step()
        timer.stop()
        history.append(evaluate_accuracy_distributed(net, test_iter, device))
    <<SUMMARY>>
    return history
"""

RIGHT = {
    "WRAP": "net.apply(init_weights)\n    model = DDP(net.to(device))",
    "TRAIN_ITER": "train_iter = DataLoader(train_set, batch_size // world, sampler=sampler)",
    "SET_EPOCH": "sampler.set_epoch(epoch)",
    "STEP": "loss(model(X), y).backward()",
    "SUMMARY": "if rank == 0:\n        "
    "print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch')",
}

forgets_set_epoch = Mistake(
    source=variant(TEMPLATE, RIGHT, SET_EPOCH="pass"),
    fails="shuffles_differently_each_epoch",
    hint_mentions="set_epoch(epoch)",
)

every_rank_loads_the_whole_data = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        TRAIN_ITER="train_iter = DataLoader(train_set, batch_size // world, shuffle=True)",
    ),
    fails="each_rank_trains_on_its_own_shard",
    hint_mentions="DistributedSampler",
)

local_batch_of_the_global_size = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        TRAIN_ITER="train_iter = DataLoader(train_set, batch_size, sampler=sampler)",
    ),
    fails="each_rank_takes_its_share_of_the_global_batch",
    hint_mentions="batch_size // world_size",
)

initialises_after_wrapping = Mistake(
    source=variant(
        TEMPLATE, RIGHT, WRAP="model = DDP(net.to(device))\n    net.apply(init_weights)"
    ),
    fails="ranks_end_with_identical_parameters",
    hint_mentions="after initialising it",
)

steps_the_unwrapped_net = Mistake(
    source=variant(TEMPLATE, RIGHT, STEP="loss(net(X), y).backward()"),
    fails="ranks_end_with_identical_parameters",
    hint_mentions="step only through the wrapped model",
)

every_rank_prints = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        SUMMARY="print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch')",
    ),
    fails="rank_zero_alone_prints_the_summary",
    hint_mentions="rank 0 only",
)

scales_the_learning_rate_with_the_world = Mistake(
    source=variant(TEMPLATE, RIGHT).replace(
        "torch.optim.SGD(model.parameters(), lr)", "torch.optim.SGD(model.parameters(), lr * world)"
    ),
    fails="matches_one_process_on_the_same_global_batches",
    hint_mentions="the lr that train_ddp was called with",
)

evaluates_on_rank_zero_alone = Mistake(
    source=variant(TEMPLATE, RIGHT).replace(
        "        history.append(evaluate_accuracy_distributed(net, test_iter, device))",
        "        if rank == 0:\n"
        "            history.append(evaluate_accuracy_distributed(net, test_iter, device))",
    ),
    fails="ranks_end_with_identical_parameters",
    hint_mentions="in the same order",
)
