"""Hidden checks of the from-scratch `train(...)` loop."""

from grader.api import _, check_on, expect
from grader.exercises.train_loop.checks import EPOCHS, recorded_run

one_device = recorded_run.using(
    "one_device",
    "Ten epochs on a single device, train_batch replaced by a recorder.",
    num_epochs=EPOCHS,
    num_devices=1,
)


@check_on(
    one_device,
    points=1,
    hint="Use the devices you are given, however many: nothing about two devices is fixed.",
)
def works_with_a_single_device(seen, ctx):
    """With one device, every step trains one replica on that device on every batch.
    Property: the loop works with any number of devices; against the reference (the device
    given, one replica on it, every batch)."""
    # Steps in another order or number are visits_every_batch_once_per_epoch's cause.
    device = [str(ctx.devices[0])]
    got = [(e[1], len(e[2]), e[3], e[4]) for e in seen["log"] if e[0] == "step"]
    wanted = [(f"train {i}", 1, device, [device]) for i in range(3)] * EPOCHS
    batches = [g[0] for g in got]
    loop_slip = bool(batches) and all(b.startswith("train ") for b in batches)
    expect(
        batches == [w[0] for w in wanted],
        _(
            "with one device, train_batch saw {count} batches, expected batches 0, 1, 2 in each "
            "of {epochs} epochs"
        ).format(count=len(got), epochs=EPOCHS),
        see="visits_every_batch_once_per_epoch" if loop_slip else None,
    )
    expect(
        got == wanted,
        _(
            "with one device, train_batch got (batch, replicas, devices, where the replicas "
            "are) {got}..., "
            "expected {wanted}... in each of {epochs} epochs"
        ).format(got=got[:3], wanted=wanted[:3], epochs=EPOCHS),
    )
