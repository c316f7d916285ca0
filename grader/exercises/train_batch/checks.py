"""Public checks of `train_batch(X, y, device_params, devices, lr)`: one data-parallel SGD step.

The yardstick is plain SGD on one device: the summed loss of the whole batch, backward,
and an update divided by the whole batch size. One check compares the step with it, on an
even split over two devices; the others compare the code with itself, through relations any
correct step keeps (unequal shards step as one device does with the same batch, four devices
as two do, a second step as a first from the same weights), so that a step wrong everywhere
costs that one check. When a replica is wrong, the checks compare it with what each
well-known mistake would give, and name the one that matches.

`train_batch` calls the notebook's `split_batch`, `allreduce`, `lenet` and `loss`; the
cases hold them right (see grader.api), so that only `train_batch` itself is judged here.
Every forward pass is recorded: each device must run its own replica on its own shard,
not one device the whole batch.
"""

import torch

import dplab
from grader.api import (
    N_,
    Fail,
    SeenTensor,
    _,
    attempt,
    case,
    check_on,
    close,
    cycle,
    error_hints,
    expect,
    expect_close,
    lenet_loss,
    observe,
    random_batch,
    returned,
    seeded,
    which_replica,
)

LR = 0.1
SCALE = 0.1  # larger than the book's 0.01, so that every layer's update is clearly visible
NAMES = ["W1", "b1", "W2", "b2", "W3", "b3", "W4", "b4"]
ORDER_HINT = N_("Follow the book's order: split, loss and backward per device, all-reduce, update.")


def start(seed: int) -> list[torch.Tensor]:
    """Return the parameters every replica starts from."""
    return dplab.lenet_params(scale=SCALE, seed=seed)


HELD = ("split_batch", "allreduce", "lenet", "loss")


def fresh_replicas(values: list[list[torch.Tensor]], devices) -> list[list[torch.Tensor]]:
    """Return trainable replicas holding `values`, one list per device, with no gradients."""
    return [
        [t.detach().clone().to(d).requires_grad_() for t in replica]
        for replica, d in zip(values, devices, strict=True)
    ]


def one_step(student, ctx, n: int, k: int) -> dict:
    """Make k replicas and call train_batch once on the case's random batch of n examples,
    noting every forward pass: its device, its rows and the replica it ran with (kept when
    the call raises, as what ran before the error shows how the work was split)."""
    devices = cycle(ctx.devices, k)
    replicas = fresh_replicas([start(ctx.seed)] * k, devices)
    forwards: list[list] = []
    model = student.get("lenet", dplab.lenet)

    def lenet(X, params):
        forwards.append([str(X.device), int(X.shape[0]), which_replica(replicas, params)])
        return model(X, params)

    X, y = random_batch(seeded(ctx.seed), n)
    fn = student.fn
    with student.replaced(lenet=lenet):
        call = attempt(fn, X, y, replicas, devices, LR)
    return {"replicas": replicas, "forwards": forwards, "raised": call.raised}


@case(holds=HELD)
def random_steps(student, ctx, n: int, k: int) -> dict:
    """Make k replicas and call train_batch once on a random batch of n examples, noting
    every forward pass: its device, its rows and the replica it ran with."""
    return one_step(student, ctx, n, k)


@case(holds=HELD)
def own_steps(student, ctx, runs: tuple[tuple[int, int], ...]) -> dict:
    """Call train_batch once for each (n, k) of `runs`, each from the same starting weights,
    on the case's random batch of n examples over k devices: the checks compare the calls
    with one another."""
    return {"runs": [one_step(student, ctx, n, k) for n, k in runs]}


@case(holds=HELD)
def step_after_step(student, ctx, n: int, k: int) -> dict:
    """Call train_batch on a first random batch, then on a second; and, from fresh replicas
    holding what the first call left, on the second batch alone."""
    devices = cycle(ctx.devices, k)
    gen = seeded(ctx.seed)
    first, second = random_batch(gen, n), random_batch(gen, n)
    fn = student.fn
    replicas = fresh_replicas([start(ctx.seed)] * k, devices)
    fn(*first, replicas, devices, LR)
    between = [[t.detach().clone() for t in r] for r in replicas]
    fn(*second, replicas, devices, LR)
    fresh = fresh_replicas(between, devices)
    fn(*second, fresh, devices, LR)
    return {"in_a_row": replicas, "afresh": fresh}


def gradients(params: list[torch.Tensor], X: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Return the gradient of LeNet's summed loss on (X, y) at `params`."""
    leaves = [p.detach().clone().requires_grad_() for p in params]
    lenet_loss(dplab.lenet(X, leaves), y).sum().backward()
    return [p.grad for p in leaves]


def expected_after(seed: int, n: int) -> list[torch.Tensor]:
    """Return the parameters after one plain single-device SGD step on the whole batch."""
    params = start(seed)
    X, y = random_batch(torch.Generator().manual_seed(seed), n)
    return [p - LR * g / n for p, g in zip(params, gradients(params, X, y), strict=True)]


def mistakes_after(seed: int, n: int, k: int) -> dict[str, list[list[torch.Tensor]]]:
    """Return, for each well-known mistake, the k replicas that one step would leave."""
    params = start(seed)
    X, y = random_batch(torch.Generator().manual_seed(seed), n)
    pieces = list(zip(torch.chunk(X, k), torch.chunk(y, k), strict=True))
    shard_grads = [gradients(params, Xs, ys) for Xs, ys in pieces]
    sizes = [len(ys) for _, ys in pieces]
    total = [sum(gs) for gs in zip(*shard_grads, strict=True)]
    mean_total = [
        sum(g / s for g, s in zip(gs, sizes, strict=True)) for gs in zip(*shard_grads, strict=True)
    ]

    def step(grads, size):
        return [p - LR * g / size for p, g in zip(params, grads, strict=True)]

    return {
        "no_allreduce": [step(shard_grads[j], n) for j in range(k)],
        "shard_size": [step(total, sizes[j]) for j in range(k)],
        "mean_loss": [step(mean_total, n)] * k,
        "mean_of_means": [step(mean_total, k)] * k,
        "no_division": [step(total, 1)] * k,
        "no_update": [params] * k,
    }


MISTAKE_HINTS = {
    "no_allreduce": N_(
        "Each replica moved by its own shard's gradient only, so the replicas "
        "drift apart: all-reduce every parameter's gradients across the devices before updating."
    ),
    "shard_size": N_(
        "The update was divided by the shard size; after the all-reduce each gradient "
        "sums over the whole batch, so divide by the whole batch size, X.shape[0]."
    ),
    "mean_loss": N_(
        "Each device averaged its loss; sum the per-example losses on each device "
        "(.sum()) and let the update divide by the whole batch size once."
    ),
    "mean_of_means": N_(
        "Each device averaged its loss and the update divided by the number of devices: "
        "right only when the shards are equal, as a smaller shard's examples then weigh more. "
        "Sum the per-example losses (.sum()) and divide the update by the whole batch size."
    ),
    "no_division": N_(
        "The update was not divided by the batch size: use d2l.sgd(param, lr, X.shape[0])."
    ),
    "no_update": N_(
        "The parameters did not change: call backward on each device's loss, "
        "then update every replica with d2l.sgd."
    ),
}


def replicas_of(seen, k: int) -> list[list[SeenTensor]]:
    """Return the replicas as k lists of eight tensors, or fail saying what they became."""
    ok = (
        isinstance(seen, list)
        and len(seen) == k
        and all(isinstance(r, list) and len(r) == 8 for r in seen)
        and all(isinstance(t, SeenTensor) for r in seen for t in r)
    )
    expect(
        ok,
        _(
            "device_params no longer holds one list of eight tensors per device: "
            "update the replicas in place"
        ),
    )
    return seen


def changed(replicas: list[list[SeenTensor]], seed: int) -> bool:
    """Return True when the step moved some replica away from where it started."""
    return any(
        not torch.equal(t.value, p0) for r in replicas for t, p0 in zip(r, start(seed), strict=True)
    )


def replicas_after(seen: dict, k: int) -> list[list[SeenTensor]]:
    """Return the k replicas a call of train_batch left; a call that raised leaves nothing
    to judge but its error (Crash)."""
    returned(seen)
    return replicas_of(seen["replicas"], k)


def diagnosis(seen, seed: int, n: int, k: int) -> str | None:
    """Return the hint of the first mistake whose replicas match the ones that came back."""
    for name, replicas in mistakes_after(seed, n, k).items():
        if all(
            close(t.value, e, rtol=1e-3, atol=1e-6)
            for got, want in zip(seen, replicas, strict=True)
            for t, e in zip(got, want, strict=True)
        ):
            return MISTAKE_HINTS[name]
    return None


def expect_plain_sgd(seen, ctx, n: int, k: int) -> None:
    """Fail unless every replica equals one plain SGD step, naming a matching mistake."""
    replicas = replicas_after(seen, k)
    before = start(ctx.seed)
    wanted = expected_after(ctx.seed, n)
    for r, replica in enumerate(replicas):
        for i, (got, want, p0) in enumerate(zip(replica, wanted, before, strict=True)):
            try:
                # Compare the updates, not the parameters, so a small update cannot hide.
                expect_close(
                    got.value.double() - p0.double(),
                    (want - p0).double(),
                    _("the update of {name} on device {r}").format(name=NAMES[i], r=r),
                    rtol=1e-3,
                    atol=1e-7,
                )
            except Fail as fail:
                raise Fail(fail.message, diagnosis(replicas, ctx.seed, n, k)) from None


def finished_replicas(run: dict, k: int) -> list[list[SeenTensor]] | None:
    """Return the k replicas a call left, or None where it raised or left something else."""
    if run.get("raised"):
        return None
    seen = run.get("replicas")
    ok = (
        isinstance(seen, list)
        and len(seen) == k
        and all(isinstance(r, list) and len(r) == 8 for r in seen)
        and all(isinstance(t, SeenTensor) for r in seen for t in r)
    )
    return seen if ok else None


def same_update(a: list[SeenTensor], b: list, seed: int) -> bool:
    """Return True when two replicas (the second seen, or plain tensors) moved by the same
    update, within float rounding."""
    return all(
        close(
            x.value.double() - p0.double(),
            getattr(y, "value", y).double() - p0.double(),
            1e-3,
            1e-7,
        )  # fmt: skip
        for x, y, p0 in zip(a, b, start(seed), strict=True)
    )


def device_count_shows_on_even_shards(runs: list[dict], seed: int) -> bool:
    """Return True where the code's own step over two devices, shards even, differs from its
    own step on one device with the same batch (`runs`: those two calls, in that order)."""
    two, one = finished_replicas(runs[0], 2), finished_replicas(runs[1], 1)
    if two is None or one is None:
        return False
    return not all(same_update(r, one[0], seed) for r in two)


def expect_own_step(
    replicas: list[list[SeenTensor]],
    base: list[list[SeenTensor]],
    seed: int,
    fewer: int,
    hint: str | None,
    see: str | None,
) -> None:
    """Fail unless every replica moved by the update the code's own step on `fewer` devices
    (its first replica, `base[0]`) made from the same weights with the same batch; `fewer`
    0: `base[0]` holds plain SGD's values."""
    before = start(seed)
    for r, replica in enumerate(replicas):
        for i, (got, want, p0) in enumerate(zip(replica, base[0], before, strict=True)):
            what = (
                _(
                    "the update of {name} on device {r}, against your own step on {fewer} "
                    "device(s) with the same batch"
                )
                if fewer
                else _(
                    "the update of {name} on device {r}, against one plain SGD step on one "
                    "device with the same batch"
                )
            )
            expect_close(
                got.value.double() - p0.double(),
                getattr(want, "value", want).double() - p0.double(),
                what.format(name=NAMES[i], r=r, fewer=fewer),
                hint,
                rtol=1e-3,
                atol=1e-7,
                see=see,
            )


even_split = random_steps.using(
    "even_split", "One step on 8 random examples over two devices (4 and 4).", n=8, k=2
)
uneven_split = own_steps.using(
    "uneven_split",
    "One step on 7 random examples over two devices (4 and 3), and the same on one device; "
    "one step on 8 over two devices (4 and 4), and the same on one device.",
    runs=((7, 2), (7, 1), (8, 2), (8, 1)),
)
two_steps = step_after_step.using(
    "two_steps",
    "Two steps in a row on 8 random examples each, over two devices, and the second alone "
    "from where the first left the replicas.",
    n=8,
    k=2,
)


@check_on(even_split, points=2, hint=ORDER_HINT)
def every_replica_matches_one_sgd_step(seen, ctx):
    """After one step every replica equals one SGD step on the whole batch on one device.
    Property: the step is plain SGD on the whole batch; against the reference."""
    expect_plain_sgd(seen, ctx, n=8, k=2)


UNEVEN_HINT = (
    "With shards of unequal size every example must still weigh the same: sum the losses on "
    "each device and divide the update by the whole batch size, X.shape[0], whatever the "
    "shards' sizes."
)


@check_on(uneven_split, points=2, hint=UNEVEN_HINT)
def uneven_split_steps_as_one_device_does(seen, ctx):
    """With shards of 4 and 3, every replica takes the step your own code takes on one
    device with the same 7 examples.
    Property: unequal shards are weighed by their size; a relation: the code against itself
    (its step over two devices against its own step on one), blind to a step that is wrong on
    one device too."""
    split, whole, *even = seen["runs"]
    replicas = replicas_after(split, 2)
    if finished_replicas(whole, 1) is None:
        # No step on one device to compare with (code that counts on two devices, which the
        # four-device check charges): plain SGD is the yardstick then, and a step off it on
        # even shards as well is the reference check's.
        even_two = finished_replicas(even[0], 2)
        sgd = [expected_after(ctx.seed, 8)]
        right = even_two is not None and all(same_update(r, sgd[0], ctx.seed) for r in even_two)
        owner = None if right else "every_replica_matches_one_sgd_step"
        expect_own_step(replicas, [expected_after(ctx.seed, 7)], ctx.seed, 0, None, owner)
        return
    base = replicas_after(whole, 1)
    observe(
        changed(replicas, ctx.seed) or changed(base, ctx.seed),
        "every_replica_matches_one_sgd_step",
        N_("the step left every replica as it was: there is no update to compare"),
    )
    # A step that depends on the shards' sizes (divides by them, drops the all-reduce) is
    # wrong on even shards too, and no relation on unequal shards alone tells it from one
    # that handles only unequal shards wrongly. So where the code's own even split already
    # differs from its own step on one device, the reference check owns the cause (see=).
    owner = (
        "every_replica_matches_one_sgd_step"
        if device_count_shows_on_even_shards(even, ctx.seed)
        else None
    )
    known = diagnosis(replicas, ctx.seed, 7, 2)
    expect_own_step(replicas, base, ctx.seed, 1, known, owner)


@check_on(
    even_split,
    points=1,
    hint="Update every replica with the same all-reduced gradients, so that they stay equal "
    "to the bit: sum in one place and copy the total to every device.",
)
def replicas_stay_identical(seen, ctx):
    """All replicas hold the same values after the step.
    Property: the replicas stay equal to the bit; a relation: the replicas against one
    another."""
    # Exactly the same, so that they never drift apart. Replicas that differ by more than
    # rounding are off the SGD step as well, which every_replica_matches_one_sgd_step charges:
    # no relation tells such a gap from a wrong step, so only a gap within rounding is this
    # check's, and a larger one says see=.
    replicas = replicas_after(seen, 2)
    observe(
        changed(replicas, ctx.seed),
        "every_replica_matches_one_sgd_step",
        N_("the step left every replica as it was: there is no update to compare"),
    )
    first = replicas[0]
    for r, replica in enumerate(replicas[1:], start=1):
        for i, (a, b) in enumerate(zip(first, replica, strict=True)):
            expect(
                torch.equal(a.value, b.value),
                _("{name} differs between device 0 and {r}").format(name=NAMES[i], r=r),
                see=None
                if close(a.value, b.value, rtol=1e-3, atol=1e-7)
                else "every_replica_matches_one_sgd_step",
            )


@check_on(
    even_split,
    points=1,
    hint="Split the batch with split_batch and run each shard through lenet with the "
    "replica on the same device: zip(X_shards, y_shards, device_params).",
)
def each_device_runs_its_replica_on_its_shard(seen, ctx):
    """With 8 examples over two devices, replica 0 runs 4 rows on the first device and
    replica 1 runs 4 rows on the second: the work is split, not done by one device.
    Property: the work is shared out; against the reference split (torch.chunk's shards)."""
    wanted = sorted([str(d), 4, r] for r, d in enumerate(ctx.devices[:2]))
    got = sorted(seen["forwards"])
    if not got and seen.get("raised"):
        returned(seen)  # nothing ran before the error: the error is all there is to say
    expect(
        got == wanted,
        _(
            "the forward passes ran as [device, rows, replica] {got}, expected {wanted}: "
            "each device its own shard with its own replica"
        ).format(got=got, wanted=wanted),
    )


@check_on(
    two_steps,
    points=3,
    hint="Zero the gradients once they have been used (d2l.sgd does, after the update), or "
    "before each backward: otherwise the next step adds the old ones in.",
)
def nothing_carries_over_between_steps(seen, ctx):
    """A second call takes the step a first call would take from the same weights: nothing
    (a gradient left from the first step, say) carries over into the next.
    Property: steps are independent; a relation: a second step in a row against the same step
    afresh."""
    # Whether a step is the right one is the other checks' concern.
    in_a_row, afresh = replicas_of(seen["in_a_row"], 2), replicas_of(seen["afresh"], 2)
    observe(
        changed(in_a_row, ctx.seed),
        "every_replica_matches_one_sgd_step",
        N_("two steps left every replica as it was: there is no step to compare"),
    )
    for r, (got, want) in enumerate(zip(in_a_row, afresh, strict=True)):
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            expect_close(
                a,
                b.value,
                _("{name} on device {r} after a second step").format(name=NAMES[i], r=r),
                rtol=1e-4,
                atol=1e-6,
            )


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "NoneType" in raised.message:
        return _(
            "A gradient is None: call .backward() on every device's loss before "
            "all-reducing the gradients."
        )
    if "Expected a non cpu device" in raised.message:
        return _("split_batch uses nn.parallel.scatter, which refuses the CPU: use d2l.scatter.")
    if "Expected all tensors to be on the same device" in raised.message:
        return _(
            "Use device_params[i] with the shard on devices[i]: zip shards, replicas and devices."
        )
    if "does not require grad" in raised.message:
        return _("The replicas must require grad: they come from get_params.")
    return None
