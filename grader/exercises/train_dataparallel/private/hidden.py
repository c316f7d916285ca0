"""Hidden checks of the concise `train(net, ...)`."""

import torch
from torch import nn

from grader.api import _, check_on, expect, expect_close, sgd_step
from grader.exercises.train_dataparallel.checks import (
    EPOCHS,
    LR,
    the_start,
    tiny_batches,
    tiny_net,
    training_run,
)
from grader.exercises.train_loop.checks import summary

ten_epochs_without_batch_norm = training_run.using(
    "ten_epochs_without_batch_norm",
    "Ten epochs with a tiny network without batch norm, whose training is deterministic.",
    lr=LR,
    batch_norm=False,
)


@check_on(
    ten_epochs_without_batch_norm,
    points=1,
    hint="Use torch.optim.SGD(net.parameters(), lr) and nn.CrossEntropyLoss() (the mean), "
    "zero the gradients before each backward, and step once per minibatch.",
)
def training_matches_plain_sgd(seen, ctx):
    """From the weights of its first forward pass, training gives what plain minibatch SGD
    gives.
    Property: the training step; against the reference (plain minibatch SGD from the weights
    of the first forward pass; whether and how the network was wrapped is the wrapping
    check's)."""
    start = {k: v.value for k, v in the_start(seen).items()}
    net = tiny_net(0, batch_norm=False)
    net.load_state_dict(start)
    for _epoch in range(EPOCHS):
        for X, y in tiny_batches()["train"]:
            net.zero_grad()
            nn.functional.cross_entropy(net(X), y).backward()
            sgd_step(net.parameters(), LR)
    for name, wanted in net.state_dict().items():
        expect_close(
            seen["final"][name],
            wanted,
            _("{name} after training").format(name=name),
            rtol=1e-3,
            atol=1e-5,
        )


@check_on(
    ten_epochs_without_batch_norm,
    points=1,
    hint="End with print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch "
    "on {str(devices)}').",
)
def prints_the_summary_line(seen, ctx):
    """It prints the book's summary line (either edition's) with the devices it trained on.
    Property: the summary line; against the reference (the book's line)."""
    found = summary(seen["printed"])
    expect(
        found is not None,
        _("no line like 'test acc: 0.91, 12.3 sec/epoch on [...]' was printed"),
    )
    wanted = str([torch.device(d) for d in seen["devices"]])
    expect(
        found[2] == wanted,
        _("the summary names the devices {got}, expected {wanted}").format(
            got=found[2], wanted=wanted
        ),
    )
