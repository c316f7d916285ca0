"""Public checks of the from-scratch `train(...)` loop.

The loop is checked twice. First on three tiny batches with `get_params`, `train_batch` and
`lenet` replaced by recorders, so that its shape is judged on its own: epochs outside,
minibatches inside, every step on every device's replica, evaluation on the first device, a
plotted point and a summary line per run. The recording `train_batch` moves every replica it
gets by a mark (MARK), as a step moves the weights, so that what is evaluated is judged by
its values, whatever route made the replicas (get_params, `.to`, a copy each epoch). Then
for real on the embedded sample, with the functions it calls held right (see grader.api),
where the accuracy must rise above chance.

The loop runs for the book's ten epochs, the default of `num_epochs`: code moved from the
book, which fixes `num_epochs = 10` in the function, runs the same. A call that raises
partway still leaves what it did before to be judged: a summary line that fails to print
costs the summary and the returned history, not the loop.
"""

import contextlib
import io
import re

import torch

import dplab
from grader.api import (
    N_,
    Fail,
    FirstBatches,
    MarkedSteps,
    RecordedBatches,
    _,
    attempt,
    batch_name,
    case,
    check_on,
    error_hints,
    expect,
    mark_of,
    observe,
    quiet_plots,
    returned,
    sample_images,
    which_replica,
)

# The book's summary line, in the English edition and in the Chinese one.
SUMMARY = re.compile(
    r"test acc: (\d\.\d\d), (\d+\.\d) sec/epoch on (\[.*\])"
    r"|测试精度[:：]\s*(\d\.\d\d)\s*[,，]\s*(\d+\.\d)\s*秒/轮\s*[,，]\s*在\s*(\[.*\])"
)
EPOCHS = 10
MARK = 0.01  # what the recording train_batch adds to every weight of every replica it gets


def summary(printed: str) -> tuple[str, str, str] | None:
    """Return (accuracy, seconds, devices) from the book's summary line, in either edition."""
    match = SUMMARY.search(printed)
    if match is None:
        return None
    groups = match.groups()
    return groups[:3] if groups[0] is not None else groups[3:]


def tiny_batches() -> dict[str, list]:
    """Return three training batches and two test batches of eight sample images each."""
    return {
        "train": [sample_images(8, start=8 * i) for i in range(3)],
        "test": [sample_images(8, start=8 * i, split="test") for i in range(2)],
    }


@case
def recorded_run(student, ctx, num_epochs: int, num_devices: int) -> dict:
    """Run train on three tiny batches, with get_params, train_batch and lenet recorded; the
    recording train_batch moves every replica it gets by MARK."""
    devices = ctx.devices[:num_devices]
    batches = tiny_batches()
    params = dplab.lenet_params(seed=ctx.seed)
    start = params[0].detach().clone()
    log: list = []

    def get_params(params, device):
        log.append(("copy", str(device)))
        return [p.to(device) for p in params]

    train_batch = MarkedSteps(log, batches, start, MARK)

    def lenet(X, params):
        log.append(
            (
                "forward",
                batch_name(batches, X),
                which_replica(train_batch.replicas, params),
                mark_of(params, start),
            )
        )
        return dplab.lenet(X, params)

    printed = io.StringIO()
    data = (
        RecordedBatches(batches["train"], "train", log),
        RecordedBatches(batches["test"], "test", log),
    )
    fn = student.fn
    with (
        student.replaced(
            get_params=get_params,
            train_batch=train_batch,
            lenet=lenet,
            params=params,
        ),
        quiet_plots(student, log),
        contextlib.redirect_stdout(printed),
    ):
        call = attempt(
            fn,
            num_gpus=len(devices),
            batch_size=8,
            lr=0.1,
            num_epochs=num_epochs,
            data=data,
            devices=devices,
        )
    return {
        "returned": call.returned,
        "raised": call.raised,
        "log": log,
        "printed": printed.getvalue(),
    }


def steps(seen: dict) -> list[str]:
    """Return the batches train_batch was called with, in order ("train 0", ...)."""
    return [e[1] for e in seen["log"] if e[0] == "step"]


def epochs_run(seen: dict) -> int:
    """Return how many passes the loop made over the training batches: its epochs."""
    return sum(1 for e in seen["log"] if tuple(e) == ("pass", "train"))


def epoch_counts(seen: dict) -> set[int]:
    """Return the numbers of epochs a per-epoch record may have: the epochs asked for, or
    those the loop ran (a wrong count is `visits_every_batch_once_per_epoch`'s to charge)."""
    run = epochs_run(seen)
    return {EPOCHS, run} if run else {EPOCHS}


def epochs_of(seen: dict) -> list[list[tuple]]:
    """Split the log into epochs: each starts when the training batches are iterated again."""
    epochs: list[list[tuple]] = []
    for e in seen["log"]:
        if tuple(e) == ("pass", "train"):
            epochs.append([])
        elif epochs:
            epochs[-1].append(e)
    return epochs


ten_epochs_on_tiny_batches = recorded_run.using(
    "ten_epochs_on_tiny_batches",
    "Ten epochs over 3 training and 2 test batches, train_batch replaced by a recorder.",
    num_epochs=EPOCHS,
    num_devices=2,
)

# Ten epochs of 6 batches of 16 images (8 a device) make 60 steps. The convolutions' own
# arithmetic is most of the case's time, so it grows with the images a step: batches of 32
# at lr 0.2 reached the same accuracies (0.46 to 0.71 over 36 seeds) at 1.3 s a run, 16 take
# 0.9 s. At lr 0.2, 16 images a step sometimes diverged (0.06 once in 12 seeds).
LEARNING_BATCHES, LEARNING_SIZE, LEARNING_RATE = 6, 16, 0.15


@case(holds=("get_params", "train_batch", "lenet"))
def learns_on_the_sample(student, ctx):
    """Ten epochs of 6 batches of 16 images from the embedded sample, lr 0.15, starting from
    weights of scale 0.1, which get going faster than the book's 0.01. The loop evaluates on
    20 test images (what it measures is only shown; the judge measures the trained replica
    on 500). The reference reaches 0.42 to 0.67 this way over 36 seeds (chance is 0.10).
    What is measured is the first replica of the last step, the weights the loop trained
    last, whichever way it made or re-made its replicas."""
    data = dplab.data.embedded_sample()
    shuffled = dplab.Batches(
        data.train_images, data.train_labels, LEARNING_SIZE, shuffle=True, seed=ctx.seed
    )
    train_iter = FirstBatches(shuffled, LEARNING_BATCHES)
    test_iter = dplab.Batches(data.test_images[:20], data.test_labels[:20], 20)
    last: list = []
    real_train_batch = student.get("train_batch")

    def train_batch(X, y, device_params, devices, lr):
        last[:] = [device_params]
        return real_train_batch(X, y, device_params, devices, lr)

    log: list = []
    fn = student.fn
    with (
        student.replaced(
            train_batch=train_batch, params=dplab.lenet_params(scale=0.1, seed=ctx.seed)
        ),
        quiet_plots(student, log),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        call = attempt(
            fn,
            num_gpus=2,
            batch_size=LEARNING_SIZE,
            lr=LEARNING_RATE,
            num_epochs=EPOCHS,
            data=(train_iter, test_iter),
            devices=ctx.devices[:2],
        )
    trained = last[0][0] if last and len(last[0]) else None
    return {"raised": call.raised, "last_replica": list(trained) if trained else None}


@check_on(
    ten_epochs_on_tiny_batches,
    points=2,
    hint="Put the epoch loop outside and the minibatch loop inside: "
    "for epoch in range(num_epochs): for X, y in train_iter: train_batch(...).",
)
def visits_every_batch_once_per_epoch(seen, ctx):
    """With 3 batches and 10 epochs, train_batch sees batches 0, 1, 2 in every epoch.
    Property: the loops' order; against the reference (batches 0, 1, 2 in every epoch)."""
    wanted = [f"train {i}" for i in range(3)] * EPOCHS
    got = steps(seen)
    if got != wanted and sorted(got) == sorted(wanted) and got == sorted(got):
        raise Fail(
            _("train_batch saw {got}..., expected {wanted}...").format(
                got=got[:9], wanted=wanted[:9]
            ),
            _(
                "The loops are swapped: each minibatch is trained for every epoch before "
                "moving on. The epoch loop goes outside, the minibatch loop inside."
            ),
        )
    shown = f"{got[:9]}{'...' if len(got) > 9 else ''}"
    expect(
        got == wanted,
        _(
            "train_batch saw {count} batches, {shown}; expected batches 0, 1, 2 in each of "
            "{epochs} epochs"
        ).format(count=len(got), shown=shown, epochs=EPOCHS),
    )


@check_on(
    ten_epochs_on_tiny_batches,
    points=1,
    hint="Give every device its own copy of the parameters, "
    "device_params = [get_params(params, d) for d in devices], and hand train_batch all of "
    "them with all the devices: train_batch(X, y, device_params, devices, lr).",
)
def every_step_uses_every_devices_replica(seen, ctx):
    """Each call of train_batch gets the list of all the devices and one replica per device,
    each on its own device and none shared: no device sits idle.
    Property: every step uses every device; against the reference (the devices given, one
    replica of its own on each, however the replicas were made)."""
    devices = [str(d) for d in ctx.devices[:2]]
    observe(
        any(e[0] == "step" for e in seen["log"]),
        "visits_every_batch_once_per_epoch",
        N_("train_batch was never called: there is no step to judge"),
    )
    for e in seen["log"]:
        if e[0] == "step":
            used, got_devices, where = e[2], e[3], e[4]
            expect(
                got_devices == devices
                and len(used) == len(devices)
                and len(set(used)) == len(used)
                and where == [[d] for d in devices],
                _(
                    "train_batch got {count} replica(s) on {where} and the devices "
                    "{got_devices}; expected one replica of its own on each of {devices}: "
                    "every device trains on its share of each minibatch"
                ).format(count=len(used), where=where, got_devices=got_devices, devices=devices),
            )


@check_on(
    ten_epochs_on_tiny_batches,
    points=1,
    hint="After each epoch's minibatches, evaluate a replica being trained, as the book does "
    "with the first device's: d2l.evaluate_accuracy_gpu(lambda x: lenet(x, device_params[0]), "
    "test_iter, devices[0]).",
)
def evaluates_a_trained_replica_after_each_epoch(seen, ctx):
    """After each epoch's minibatches, every test batch goes through LeNet with a replica that
    train_batch updates: the replicas are equal, so the book's first one stands for them all.
    Property: the model evaluated is the one being trained; a relation: the weights evaluated
    against those the last step left (by value, so a copy of a replica counts)."""
    # Evaluations in the number of epochs asked for, in a loop whose epochs are wrong, are
    # visits_every_batch_once_per_epoch's cause.
    log = seen["log"]
    tests = [e for e in log if e[0] == "forward" and e[1].startswith("test")]
    expect(tests, _("the test batches never went through LeNet: evaluate after each epoch"))
    expect(
        all(e[3] is not None and abs(e[3] - trained_mark(log, e)) < MARK / 10 for e in tests),
        _(
            "the test batches ran with parameters that are none of the replicas train_batch "
            "updates, so the accuracy is not that of the model being trained"
        ),
    )
    evaluations = sum(1 for e in log if tuple(e) == ("pass", "test"))
    wrong_loop = evaluations == EPOCHS and epochs_run(seen) != EPOCHS
    see = "visits_every_batch_once_per_epoch" if wrong_loop else None
    for number, epoch in enumerate(epochs_of(seen), start=1):
        last_step = max((i for i, e in enumerate(epoch) if e[0] == "step"), default=-1)
        tests = [e for e in epoch if e[0] == "forward" and e[1].startswith("test")]
        expect(
            sorted(e[1] for e in tests) == ["test 0", "test 1"],
            _(
                "in epoch {number} the test batches seen were {seen}, "
                "expected test 0 and test 1 once each"
            ).format(number=number, seen=[e[1] for e in tests]),
            see=see,
        )
        expect(
            all(epoch.index(e) > last_step for e in tests),
            _("in epoch {number} evaluation came before the last minibatch").format(number=number),
            see=see,
        )


def trained_mark(log: list, forward: tuple) -> float:
    """Return how far the last step before `forward` left the replica it trained on the
    first device (0.0 before any step): the weights an evaluation then should use."""
    mark = 0.0
    for e in log:
        if e is forward:
            break
        if e[0] == "step" and e[5] is not None:
            mark = e[5]
    return mark


@check_on(
    ten_epochs_on_tiny_batches,
    points=1,
    hint="Make an Animator('epoch', 'test acc', xlim=[1, num_epochs]) and call "
    "animator.add(epoch + 1, (test_acc,)) once per epoch.",
)
def plots_the_test_accuracy_each_epoch(seen, ctx):
    """The Animator gets one point per epoch, at x = 1, 2, ..., with an accuracy in [0, 1].
    Property: the plot; against the reference (one point per epoch)."""
    # Per epoch asked for, or per epoch the loop ran where that is wrong (the epochs' cause).
    points = [e for e in seen["log"] if e[0] == "plot"]
    xs = [float(p[1]) for p in points if isinstance(p[1], int | float)]
    expect(
        any(xs == [float(i) for i in range(1, n + 1)] for n in epoch_counts(seen)),
        _("the plot got points at x = {xs}, expected {wanted}").format(
            xs=xs, wanted=list(range(1, EPOCHS + 1))
        ),
    )
    for p in points:
        ys = p[2]
        expect(
            len(ys) >= 1 and all(isinstance(v, float | int) and 0 <= v <= 1 for v in ys),
            _("the plotted values {ys} are not accuracies between 0 and 1").format(ys=ys),
        )


@check_on(
    ten_epochs_on_tiny_batches,
    points=1,
    hint="End with the book's line: print(f'test acc: {animator.Y[0][-1]:.2f}, "
    "{timer.avg():.1f} sec/epoch on {str(devices)}').",
)
def prints_the_summary_line(seen, ctx):
    """It prints `test acc: 0.xx, y.y sec/epoch on [devices]` (or the Chinese edition's
    `测试精度：0.xx，y.y秒/轮，在[devices]`) with the devices it used.
    Property: the summary line; against the reference (the book's line)."""
    found = summary(seen["printed"])
    printed = seen["printed"].strip().splitlines()[-3:]
    expect(
        found is not None,
        _(
            "no line like 'test acc: 0.84, 2.8 sec/epoch on [...]' was "
            "printed; the last lines printed were {printed}"
        ).format(printed=printed),
    )
    wanted = str(ctx.devices[:2])
    expect(
        found[2] == wanted,
        _("the summary names the devices {got}, expected {wanted}").format(
            got=found[2], wanted=wanted
        ),
    )


@check_on(
    ten_epochs_on_tiny_batches,
    points=1,
    hint="Return the test accuracies, one per epoch (animator.Y[0] holds them).",
)
def returns_the_accuracy_history(seen, ctx):
    """It returns a list of one test accuracy per epoch, ending with the printed one.
    Property: the history returned; against the reference (one per epoch), and a relation: its
    last value against the printed one."""
    # Per epoch asked for, or per epoch the loop ran where that is wrong (the epochs' cause).
    expect_history(seen, EPOCHS, epoch_counts(seen))


def expect_history(seen: dict, epochs: int, counts: set[int] | None = None) -> None:
    """Fail unless the loop returned one test accuracy for each of `epochs` (or of one of
    `counts`), the last one as printed (the concise loop is judged by the same rule)."""
    history = returned(seen)
    expect(
        isinstance(history, list)
        and len(history) in (counts or {epochs})
        and all(isinstance(a, int | float) and 0 <= a <= 1 for a in history),
        _("train returned {history}, expected a list of {epochs} accuracies").format(
            history=repr(history), epochs=epochs
        ),
    )
    found = summary(seen["printed"])
    if found:
        expect(
            f"{history[-1]:.2f}" == found[0],
            _("the last accuracy returned is {returned} but {printed} was printed").format(
                returned=f"{history[-1]:.2f}", printed=found[0]
            ),
        )


@check_on(
    learns_on_the_sample,
    points=1,
    hint="The loop must call train_batch on every minibatch with the replicas, keep training "
    "the same weights from one epoch to the next, and evaluate the first replica.",
)
def accuracy_rises_above_chance(seen, ctx):
    """After ten short epochs on the sample, the replica the last step trained on the first
    device classifies at least 30% of test images correctly (chance is 10%); the grader
    measures it itself.
    Property: the loop trains; against the reference (a known bar, 0.30, where chance is 0.10
    and the reference loop reaches 0.42 to 0.67)."""
    params = seen["last_replica"]
    expect(
        isinstance(params, list) and len(params) == 8,
        _("train_batch was never called with a replica, so there is no trained model to measure"),
    )
    X, y = sample_images(500, split="test")
    with torch.no_grad():
        acc = dplab.accuracy(dplab.lenet(X, [p.value for p in params]), y) / len(y)
    expect(
        acc >= 0.3,
        _(
            "after ten epochs the first replica has test accuracy {acc}, "
            "expected at least 0.30 (chance is 0.10)"
        ).format(acc=f"{acc:.2f}"),
    )


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "NVIDIA driver" in raised.message or "Torch not compiled with CUDA" in raised.message:
        return _(
            "This names a CUDA device directly (torch.device('cuda:0'), .cuda()), which fails "
            "on a machine without GPUs: use the devices you are given, devices[i]."
        )
    if "Invalid format specifier" in raised.message:
        return _(
            "A format such as {x :.2f } has spaces inside the braces: write {x:.2f}, with "
            "nothing between the value, the colon and the format."
        )
    return None
