"""Hidden checks of `train_batch`: four replicas judged against the reference solution."""

import torch

from grader.api import Fail, _, check, expect_close, random_batch, seeded
from grader.exercises.train_batch.checks import (
    LR,
    NAMES,
    diagnosis,
    random_steps,
    replicas_after,
    slipped,
    start,
)

four_replicas = random_steps.using(
    "four_replicas", "One step on 10 random examples over four devices (3, 3, 3 and 1).", n=10, k=4
)


@check(
    four_replicas,
    points=2,
    hint="Loop over all devices, not just two: split, backward and update on each of them.",
)
def matches_the_reference_on_four_devices(seen, ctx):
    """With four replicas, every replica equals the reference train_batch's."""
    # A known mistake that shows on two devices as well is every_replica_matches_one_sgd_
    # step's, which it names; one that shows only with four devices (a loop over two) is
    # this check's.
    replicas = replicas_after(seen, 4)
    devices = [torch.device("cpu")] * 4
    wanted = [[t.requires_grad_() for t in start(ctx.seed)] for _ in devices]
    X, y = random_batch(seeded(ctx.seed), 10)
    ctx.reference["train_batch"](X, y, wanted, devices, LR)
    for r, (got, want) in enumerate(zip(replicas, wanted, strict=True)):
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            what = _("{name} on device {r}").format(name=NAMES[i], r=r)
            try:
                expect_close(a, b.detach(), what, rtol=1e-4, atol=1e-6)
            except Fail as fail:
                known = diagnosis(replicas, ctx.seed, 10, 4)
                owner = "every_replica_matches_one_sgd_step" if slipped(known) else None
                raise Fail(fail.message, known, owner) from None
