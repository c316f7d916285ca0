"""Hidden checks of `train_batch`: four replicas judged against the code's own two."""

import torch

from grader.api import N_, _, check_on, observe
from grader.exercises.train_batch.checks import (
    changed,
    device_count_shows_on_even_shards,
    expect_own_step,
    own_steps,
    replicas_after,
    start,
)

four_devices = own_steps.using(
    "four_devices",
    "One step on 12 random examples over four devices (3 each), the same over two devices "
    "(6 each), and the same on one device.",
    runs=((12, 4), (12, 2), (12, 1)),
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


@check_on(
    four_devices,
    points=2,
    hint="With four devices the step must be the one your code takes on two devices with the "
    "same batch: look for what is fixed to two devices (range(2), devices[:2], [0, 1]).",
)
def four_devices_step_as_two_do(seen, ctx):
    """With 12 examples over four devices, every replica takes the step your own code takes
    over two devices with the same batch.
    Property: the step on more than two devices; a relation: the code against itself (its
    step over four devices against its own over two), blind to a step that is wrong on two
    devices too. The loop over all devices is hinted at only where a replica ran no forward
    pass, or kept its weights while the others moved."""
    four, two, one = seen["runs"]
    replicas = replicas_after(four, 4)
    base = replicas_after(two, 2)
    observe(
        changed(replicas, ctx.seed) or changed(base, ctx.seed),
        "every_replica_matches_one_sgd_step",
        N_("the step left every replica as it was: there is no update to compare"),
    )
    # Shards are even here, so that a step wrong only on unequal shards is the uneven
    # check's. A step that depends on the number of devices shows on two devices against
    # one as well, and no relation between four devices and two tells it from a loop fixed
    # to two: where the code's own two devices already differ from its one, the reference
    # check owns the cause (see=).
    owner = (
        "every_replica_matches_one_sgd_step"
        if device_count_shows_on_even_shards([two, one], ctx.seed)
        else None
    )
    hint = _(ALL_DEVICES_HINT) if devices_left_out(four, replicas, ctx.seed) else None
    expect_own_step(replicas, base, ctx.seed, 2, hint, owner)
