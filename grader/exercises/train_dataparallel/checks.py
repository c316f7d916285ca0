"""Public checks of the concise `train(net, ...)`: training a network with nn.DataParallel.

The checks pass a tiny network (one convolution, batch norm, a linear layer) instead of
ResNet-18, so that a few steps take a fraction of a second on a CPU, and record what the
student's code does with it: how it is wrapped, how it is initialised, which devices run
each minibatch, when it runs in training or evaluation mode, whether its loss falls, and what
it returns (the test accuracies, as the from-scratch loop's are judged).

Each check judges one thing with the rest held right. The network comes already on the
first device, so that code which forgets `net.to(devices[0])` (as the book's does) loses
only the check about that, which alone hands over a network left on the CPU; it judges
where the parameters are when the first minibatch goes through, which is when
nn.DataParallel looks, so moving the network before wrapping it and after (as PyTorch's
tutorial and the book's `train_ch13` do) are the same. The loop runs for the book's ten
epochs, the default of `num_epochs`; a call that raises partway still leaves what it did
before to be judged.
"""

import contextlib
import io
from collections.abc import Callable
from unittest import mock

import torch
from torch import nn

import dplab
from grader.api import (
    Fail,
    RecordedBatches,
    SeenTensor,
    _,
    attempt,
    batch_name,
    case,
    check_on,
    error_hints,
    expect,
    quiet_animator,
    returned,
    sample_images,
)
from grader.exercises.train_loop.checks import expect_history

LR = 0.5
EPOCHS = 10


def tiny_net(seed: int, batch_norm: bool = True) -> nn.Sequential:
    """Return a small convolutional network for 1x28x28 images, built from `seed`."""
    torch.manual_seed(seed)
    layers = [nn.Conv2d(1, 16, kernel_size=3, padding=1)]
    if batch_norm:
        layers.append(nn.BatchNorm2d(16))
    layers += [nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)]
    return nn.Sequential(*layers)


def tiny_batches() -> dict[str, list]:
    """Return two training batches and one test batch of 16 sample images each."""
    X, y = sample_images(32)
    Xt, yt = sample_images(16, split="test")
    return {"train": [(X[:16], y[:16]), (X[16:], y[16:])], "test": [(Xt, yt)]}


def state(net: nn.Module) -> dict:
    """Return a CPU copy of the network's parameters and buffers."""
    return {k: v.detach().to("cpu").clone() for k, v in net.state_dict().items()}


def as_device_name(d, devices: list[torch.device]) -> str:
    """Return the name of a device given as an int (device number i of the machine, as
    nn.DataParallel reads it: on stand-ins, stand-in i), a string or a torch.device."""
    if isinstance(d, int):
        return str(torch.device(devices[0].type, d))
    return str(torch.device(d))


class TrainingRecord:
    """What a training run records of the tiny network `net`: each nn.DataParallel wrapping,
    where its parameters were and what they held at its first forward pass, each forward
    pass in `log` (with the passes over the data and the epochs), and what the student's
    code printed."""

    def __init__(
        self, net: nn.Module, devices: list[torch.device], batches: dict[str, list]
    ) -> None:
        self.net = net
        self.devices = devices
        self.batches = batches
        self.log: list = []
        self.wraps: list = []
        self.started: list = []  # the devices of the parameters at the network's first forward pass
        self.start: list = []  # and the network's weights then, where its training starts
        self.printed = io.StringIO()

    def note_start(self) -> None:
        """Note where the network's parameters are, and its weights, at its first forward pass
        only (through the network itself or a replica made of it)."""
        if not self.started:
            self.started.append(sorted({str(p.device) for p in self.net.parameters()}))
            self.start.append(state(self.net))

    def note_wrap(self, module: nn.Module, device_ids: list | None) -> None:
        """Note a wrapping of `module` in nn.DataParallel, before nn.DataParallel looks: of the
        network, or of a module that holds it (a LightningModule, a model class of the code's
        own), whose minibatches the network runs split all the same."""
        self.wraps.append(
            {
                "is_the_net": any(m is self.net for m in module.modules()),
                "device_ids": None
                if device_ids is None
                else [as_device_name(d, self.devices) for d in device_ids],
                "devices_of_parameters": sorted({str(p.device) for p in module.parameters()}),
            }
        )

    def forward_hook(self) -> Callable[[nn.Module, tuple], None]:
        """Return the forward pre-hook that logs each minibatch through the network."""

        # A plain function, not a bound method: copy.deepcopy would copy a bound method's
        # record along with a copy of the network; a function it shares, so the copy logs here.
        def note_forward(module: nn.Module, inputs: tuple) -> None:
            X = inputs[0]
            # The network itself, or a replica made of it (nn.DataParallel notes the start
            # before its replicas run; PyTorch's functional nn.parallel.data_parallel and
            # nn.parallel.replicate run only replicas, whose weights are the network's now).
            self.note_start()
            self.log.append(
                ("forward", bool(module.training), batch_name(self.batches, X), str(X.device))
            )

        return note_forward

    def data_parallel(self) -> type[nn.DataParallel]:
        """Return an nn.DataParallel that notes each wrapping and the network's first pass."""
        record = self

        class RecordingDataParallel(nn.DataParallel):
            def __init__(self, module, device_ids=None, output_device=None, dim=0):
                record.note_wrap(module, device_ids)
                super().__init__(module, device_ids, output_device, dim)

            def forward(self, *inputs, **kwargs):
                if self.module is record.net:
                    record.note_start()
                return super().forward(*inputs, **kwargs)

        return RecordingDataParallel

    def enter(self, stack: contextlib.ExitStack, student) -> None:
        """Record, until `stack` closes, every nn.DataParallel the student's code makes (by
        either name, or the notebook's own), what it plots and what it prints."""
        recording = self.data_parallel()
        stack.enter_context(mock.patch.object(nn, "DataParallel", recording))
        stack.enter_context(mock.patch.object(nn.parallel, "DataParallel", recording))
        if "DataParallel" in student.namespace:
            stack.enter_context(student.replaced(DataParallel=recording))
        stack.enter_context(mock.patch.object(dplab, "Animator", quiet_animator(self.log)))
        stack.enter_context(contextlib.redirect_stdout(self.printed))

    def seen(self, call: dict) -> dict:
        """Return what the checks judge of a run that ended with `call` (see `attempt`)."""
        return {
            "raised": call.raised,
            "returned": call.returned,
            "devices": [str(d) for d in self.devices],
            "wraps": self.wraps,
            "started_on": self.started[0] if self.started else None,
            "start": self.start[0] if self.start else None,
            "log": self.log,
            "final": state(self.net),
            "printed": self.printed.getvalue(),
        }


@case
def training_run(
    student,
    ctx,
    lr: float,
    num_epochs: int = EPOCHS,
    batch_norm: bool = True,
    placed: bool = True,
    reverse: bool = False,
) -> dict:
    """Train a tiny network with the student's train(...) and record what happened.

    `placed`: the network comes on the first device (else on the CPU); `reverse`: the two
    devices are given in the other order."""
    devices = ctx.devices[:2][::-1] if reverse else ctx.devices[:2]
    net = tiny_net(ctx.seed, batch_norm)
    if placed:
        net.to(devices[0])
    batches = tiny_batches()
    record = TrainingRecord(net, devices, batches)
    net.register_forward_pre_hook(record.forward_hook())
    data = (
        RecordedBatches(batches["train"], "train", record.log),
        RecordedBatches(batches["test"], "test", record.log),
    )
    fn = student.fn
    with contextlib.ExitStack() as stack:
        record.enter(stack, student)
        call = attempt(
            fn,
            net,
            num_gpus=len(devices),
            batch_size=16,
            lr=lr,
            num_epochs=num_epochs,
            data=data,
            devices=devices,
        )
    return record.seen(call)


def loss_of(weights: dict, batch_norm: bool = True) -> float:
    """Return the tiny network's mean cross-entropy on the 32 training images, in training mode."""
    net = tiny_net(0, batch_norm)
    net.load_state_dict(
        {k: v.value if isinstance(v, SeenTensor) else v for k, v in weights.items()}
    )
    X, y = sample_images(32)
    net.train()
    with torch.no_grad():
        return float(nn.functional.cross_entropy(net(X), y))


def the_start(seen: dict) -> dict:
    """Return the network's weights at its first forward pass, where its training starts
    (after the initialisation, wherever the code wraps it), or fail."""
    if seen["start"] is None:
        returned(seen)  # the call raised before any minibatch: its error is what there is
        raise Fail(_("no minibatch went through the network"))
    return seen["start"]


def the_wrap(seen: dict) -> dict:
    """Return the one nn.DataParallel wrapping of the network, or fail."""
    mine = [w for w in seen["wraps"] if w["is_the_net"]]
    expect(len(mine) >= 1, _("the network was never wrapped in nn.DataParallel"))
    expect(
        len(mine) == 1,
        _(
            "the network was wrapped in nn.DataParallel {count} times; "
            "wrap it once, before the epochs"
        ).format(count=len(mine)),
    )
    return mine[0]


ten_short_epochs = training_run.using(
    "ten_short_epochs",
    "Ten epochs of two batches of 16 images, learning rate 0.5, with a tiny network placed "
    "on the first device.",
    lr=LR,
)
learning_rate_zero = training_run.using(
    "learning_rate_zero",
    "One epoch with learning rate 0, so the weights stay as initialised.",
    lr=0.0,
    num_epochs=1,
)
net_left_on_the_cpu = training_run.using(
    "net_left_on_the_cpu",
    "One epoch with the tiny network handed over on the CPU.",
    lr=LR,
    num_epochs=1,
    placed=False,
)
devices_in_the_other_order = training_run.using(
    "devices_in_the_other_order",
    "One epoch on the two devices given in the other order (the second one first).",
    lr=LR,
    num_epochs=1,
    reverse=True,
)


@check_on(
    devices_in_the_other_order,
    points=1,
    hint="Wrap once, before training, on the devices you are given: "
    "net = nn.DataParallel(net, device_ids=devices).",
)
def wraps_the_net_in_data_parallel_on_the_given_devices(seen, ctx):
    """The network is wrapped once in nn.DataParallel, with exactly the devices given, in
    the order given.
    Property: the wrapping; against the reference (the devices given, in order)."""
    wrap = the_wrap(seen)
    expect(
        wrap["device_ids"] == seen["devices"],
        _("nn.DataParallel got device_ids={got}, expected {wanted}").format(
            got=wrap["device_ids"], wanted=seen["devices"]
        ),
    )


@check_on(
    net_left_on_the_cpu,
    points=1,
    hint="nn.DataParallel wants the module on device_ids[0] when the first minibatch comes: "
    "call net.to(devices[0]), before wrapping it or after.",
)
def moves_the_net_to_the_first_device(seen, ctx):
    """Handed a network on the CPU, it has every parameter on the first device when the first
    minibatch goes through nn.DataParallel, moved there before wrapping or after.
    Property: where the network is; against the reference (the first device)."""
    started = seen["started_on"]
    if started is None:
        returned(seen)  # the call raised before any minibatch: its error is what there is
        raise Fail(_("no minibatch went through the network"))
    wanted = [seen["devices"][0]]
    expect(
        started == wanted,
        _("when the first minibatch came, the parameters were on {got}, expected {wanted}").format(
            got=started, wanted=wanted
        ),
    )


@check_on(
    learning_rate_zero,
    points=1,
    hint="Apply an init function to every nn.Linear and nn.Conv2d: "
    "nn.init.normal_(m.weight, std=0.01).",
)
def initialises_weights_with_std_0_01(seen, ctx):
    """The weights of every Conv2d and Linear layer are drawn with mean 0 and std 0.01.
    Property: the initialisation; against the reference (mean 0, std 0.01)."""
    for name in ("0.weight", "5.weight"):
        w = seen["final"][name].value
        expect(
            0.006 < float(w.std()) < 0.015 and abs(float(w.mean())) < 0.005,
            _("{name} has mean {mean} and std {std}; expected mean 0 and std 0.01").format(
                name=name, mean=f"{float(w.mean()):.4f}", std=f"{float(w.std()):.4f}"
            ),
        )


@check_on(
    ten_short_epochs,
    points=2,
    hint="Each minibatch: zero the gradients, move X and y to devices[0], compute the loss "
    "of net(X), call backward, then step the optimizer.",
)
def loss_falls_on_a_small_fixed_batch(seen, ctx):
    """After ten epochs the training loss is lower than it was right after initialisation.
    Property: the loss falls; a relation: the code's run with itself (the loss after ten
    epochs against the loss at the weights of the first forward pass, by at least 2%), blind
    to how the network was wrapped, which the wrapping check judges."""
    before = loss_of(the_start(seen))
    after = loss_of(seen["final"])
    expect(
        after < 0.98 * before,
        _(
            "the loss on the training images went from {before} to {after}; "
            "expected it to fall by at least 2%"
        ).format(before=f"{before:.4f}", after=f"{after:.4f}"),
    )


@check_on(
    ten_short_epochs,
    points=1,
    hint="Run each minibatch through the nn.DataParallel wrapper, net(X), not through the "
    "network inside it: the wrapper is what splits the minibatch across the devices.",
)
def every_minibatch_is_split_across_the_devices(seen, ctx):
    """Every training minibatch runs in parts on both devices: no device sits idle.
    Property: every device works; against the reference (each minibatch in parts on both
    devices)."""
    ran_on: dict[str, set[str]] = {}
    for e in seen["log"]:
        if e[0] == "forward" and e[2].startswith("train"):
            ran_on.setdefault(e[2], set()).add(e[3])
    expect(ran_on, _("no training minibatch went through the network"))
    devices = set(seen["devices"])
    for batch, used in sorted(ran_on.items()):
        expect(
            used == devices,
            _("training {batch} ran on {used}, expected a part on each of {devices}").format(
                batch=batch, used=sorted(used), devices=sorted(devices)
            ),
        )


@check_on(
    ten_short_epochs,
    points=1,
    hint="Evaluate with d2l.evaluate_accuracy_gpu(net, test_iter), which switches to "
    "eval mode, and call net.train() at the start of every epoch.",
)
def trains_in_train_mode_and_evaluates_in_eval_mode(seen, ctx):
    """Training batches run in training mode, and the test batch runs in eval mode each epoch.
    Property: the modes; against the reference (training mode, then eval mode)."""
    forwards = [e for e in seen["log"] if e[0] == "forward"]
    train = [e for e in forwards if e[2].startswith("train")]
    test = [e for e in forwards if e[2].startswith("test")]
    expect(
        len(train) >= 2 * EPOCHS,
        _("only {count} training forwards for {epochs} epochs").format(
            count=len(train), epochs=EPOCHS
        ),
    )
    expect(
        all(e[1] for e in train),
        _(
            "some training batches ran in eval mode: call net.train() "
            "at the start of each epoch, since evaluation switches the network to eval mode"
        ),
    )
    expect(
        len(test) >= EPOCHS,
        _(
            "the test batch went through the network {count} times "
            "in {epochs} epochs; evaluate after every epoch"
        ).format(count=len(test), epochs=EPOCHS),
    )
    expect(not any(e[1] for e in test), _("the test batch ran in training mode"))


@check_on(
    ten_short_epochs,
    points=1,
    hint="Return the test accuracies, one per epoch (animator.Y[0] holds them).",
)
def returns_the_accuracy_history(seen, ctx):
    """It returns a list of one test accuracy per epoch, ending with the printed one.
    Property: the history returned; against the reference (one per epoch), and a relation: its
    last value against the printed one."""
    passes = sum(1 for e in seen["log"] if tuple(e) == ("pass", "train"))
    expect_history(seen, EPOCHS, {EPOCHS, passes})


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "module must have its parameters and buffers on device" in raised.message:
        return _(
            "Move the network to devices[0] with net.to(devices[0]), before the first minibatch."
        )
    if "has no attribute 'clone'" in raised.message:
        return _("Modules have no .clone(); nn.DataParallel makes the replicas for you.")
    return None
