"""Hidden checks of the from-scratch `train(...)` loop."""

from grader.api import check, expect
from grader.checks.train_loop import recorded_run, steps

one_device_three_epochs = recorded_run.using(
    "one_device_three_epochs",
    "Three epochs on one device, train_batch replaced by a recorder.",
    num_epochs=3,
    num_devices=1,
)


@check(
    one_device_three_epochs,
    points=1,
    hint="Use num_epochs and the devices you are given; nothing about two devices is fixed.",
)
def runs_any_number_of_epochs_on_one_device(seen, ctx):
    """With one device and three epochs, every batch is visited three times in order."""
    wanted = [f"train {i}" for i in range(3)] * 3
    expect(steps(seen) == wanted, f"train_batch saw {steps(seen)}, expected {wanted}")
    history = seen["returned"]
    expect(
        isinstance(history, list) and len(history) == 3,
        f"train returned {history!r}, expected three accuracies",
    )
