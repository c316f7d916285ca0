"""Hidden checks of `train_batch`: four replicas judged against the reference solution."""

import torch

from grader.api import N_, Fail, _, check, expect_close, random_batch, seeded
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


ALL_DEVICES_HINT = N_(
    "Loop over all devices, not just two: split, backward and update on each of them."
)


def devices_left_out(seen, replicas, seed: int) -> list[int]:
    """Return the replicas that a step over some devices only left out: those that ran no
    forward pass, or that kept their starting weights while another replica moved."""
    ran = {f[2] for f in seen["forwards"]}
    kept = [
        r
        for r, replica in enumerate(replicas)
        if all(torch.equal(t.value, p0) for t, p0 in zip(replica, start(seed), strict=True))
    ]
    moved = len(kept) < len(replicas)
    return [r for r in range(len(replicas)) if r not in ran or (moved and r in kept)]


@check(
    four_replicas,
    points=2,
    hint="With four devices and shards of 3, 3, 3 and 1, the step must still be one SGD step "
    "on the whole batch: look for what depends on the number of devices or on a shard's size.",
)
def matches_the_reference_on_four_devices(seen, ctx):
    """Property: the step on more than two devices. With four replicas, every replica equals
    the reference train_batch's. Compares with the reference. The loop over all devices is
    hinted at only where a replica ran no forward pass, or kept its weights while the others
    moved."""
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
                if known is None and devices_left_out(seen, replicas, ctx.seed):
                    known = _(ALL_DEVICES_HINT)
                raise Fail(fail.message, known, owner) from None
