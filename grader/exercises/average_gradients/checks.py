"""Public checks of `average_gradients(model)`: after backward() on every rank, each
parameter's gradient becomes its mean over the ranks, one all_reduce per parameter.

Each case runs in groups of 2, 3 and 4 processes (grader.ranks). Every rank builds the same
small network, runs its own shard of one global batch forward and backward, and calls the
student's function. The checks compare every rank's gradients with those of the same network
run by the grader in a single process on the whole batch, as DistributedDataParallel
promises, and look at the all_reduce calls on the way.
"""

import functools
import math

import torch
import torch.distributed as dist
from torch import nn

from grader.api import (
    N_,
    Fail,
    SeenTensor,
    _,
    apart,
    case,
    charged_by,
    check_on,
    error_hints,
    expect,
    expect_close,
    groups_finished,
    in_every_size,
    in_rank,
    recording_calls,
)

MEAN = "gradients_are_the_mean_over_ranks"  # the one check of the means against the reference
BATCH = 24  # the global batch: 2, 3 and 4 ranks get equal shards of it
MEAN_HINT = N_(
    "For each parameter with a gradient: dist.all_reduce(param.grad) sums it over the ranks, "
    "in place; then divide it by dist.get_world_size()."
)
SUMMED_HINT = N_(
    "The gradients are the sum over the ranks, not the mean: divide each by "
    "dist.get_world_size() after the all_reduce."
)
WEIGHTS_HINT = N_(
    "The all_reduce went to the weights (param or param.data), not to their gradients: "
    "average param.grad, and leave the weights to the optimizer."
)
UNCHANGED_HINT = N_(
    "The gradients came back as each rank's own: all_reduce each param.grad in place."
)


def grad_model(seed: int, frozen: bool = False) -> nn.Sequential:
    """Return the checks' small network, the same for a seed in every process and thread; with
    `frozen`, its first layer does not train (requires_grad False, so no gradient).

    Its weights are drawn as PyTorch's defaults are (uniform within 1/sqrt(fan in)), but from a
    generator of its own, never from torch's global one: the grader judges submissions in
    threads, and another thread may seed or draw from the global generator at any moment.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # the layers' own initialisation, overwritten below
        layers = [nn.Linear(n, m) for n, m in ((20, 32), (32, 32), (32, 10))]
    with torch.no_grad():
        for layer in layers:
            bound = 1 / math.sqrt(layer.in_features)
            layer.weight.uniform_(-bound, bound, generator=gen)
            layer.bias.uniform_(-bound, bound, generator=gen)
    net = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2])
    if frozen:
        net[0].requires_grad_(False)
    return net


def global_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the global batch of inputs and labels for a seed."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(BATCH, 20, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)


def whole_batch_gradients(seed: int, frozen: bool = False) -> list[torch.Tensor | None]:
    """Return the gradients of the network run in one process on the whole batch: what the
    mean over the ranks must equal (computed apart: see grader.ranks.apart)."""
    return apart(_whole_batch_gradients, seed, frozen)


def _whole_batch_gradients(seed: int, frozen: bool) -> list[torch.Tensor | None]:
    net = grad_model(seed, frozen)
    X, y = global_batch(seed)
    nn.functional.cross_entropy(net(X), y).backward()
    return [None if p.grad is None else p.grad.clone() for p in net.parameters()]


def gradients_body(student, seed: int, frozen: bool = False, **arguments):
    """Return the function each rank runs: its shard forward and backward, then the student's
    function on the model, recording its calls and what each all_reduce was given."""

    def body():
        rank, world = dist.get_rank(), dist.get_world_size()
        net = grad_model(seed, frozen)
        X, y = global_batch(seed)
        X, y = X.tensor_split(world)[rank], y.tensor_split(world)[rank]
        nn.functional.cross_entropy(net(X), y).backward()
        local = [None if p.grad is None else p.grad.clone() for p in net.parameters()]
        params = list(net.parameters())

        def describe(name: str, tensor: torch.Tensor) -> dict:
            return {"of": held_in(tensor, params, local, world)} if name == "all_reduce" else {}

        with recording_calls(student.namespace, describe=describe) as calls:
            outcome = in_rank(lambda: student.fn(net, **arguments))
        return {
            "grads": [
                None if p.grad is None else p.grad.detach().clone() for p in net.parameters()
            ],
            "local": local,
            "calls": calls,
            "raised": outcome.raised,
            "at": outcome.at,
            "returned": None,
        }

    return body


def _byte_range(t: torch.Tensor) -> tuple[int, int, int]:
    """Return where a tensor's elements lie: its storage's address, and the first and last
    byte (past the end) that it spans there."""
    size = t.element_size()
    first = t.storage_offset() * size
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.untyped_storage().data_ptr(), first, first + (span * size if t.numel() else 0)


def held_in(tensor: torch.Tensor, params: list, local: list, world: int) -> list[str]:
    """Name what a tensor given to all_reduce holds, in order: "grad i", "param i" or "other".

    By memory first: the gradients (as they are at the time of the call: a student may have
    made them views of a bucket) and the weights whose elements lie in the tensor's memory, so
    that a gradient scaled in place before the call is still itself. Failing that, by value,
    for a bucket that is a copy: each slice is matched with a gradient as it is now, as it was
    after backward, or that divided by the world size (a bucket scaled before the call)."""
    where, lo, hi = _byte_range(tensor)
    inside = []
    for i, p in enumerate(params):
        for kind, t in (("grad", p.grad), ("param", p)):
            if t is None or not t.numel():
                continue
            at, first, last = _byte_range(t)
            if at == where and lo <= first and last <= hi:
                inside.append((first, f"{kind} {i}"))
    if inside:
        return [name for _, name in sorted(inside)]
    return held_by_value(tensor, params, local, world)


def held_by_value(tensor: torch.Tensor, params: list, local: list, world: int) -> list[str]:
    """Name, slice by slice, the gradients or weights whose values a copied tensor holds."""
    flat = tensor.detach().flatten()
    candidates = []  # (name, values, exact)
    for i, (p, mine) in enumerate(zip(params, local, strict=True)):
        if p.grad is not None:
            candidates.append((f"grad {i}", p.grad.detach().flatten(), True))
        if mine is not None:
            candidates += [
                (f"grad {i}", mine.flatten(), True),
                (f"grad {i}", mine.flatten() / world, False),
            ]
        candidates.append((f"param {i}", p.detach().flatten(), True))
    names, offset = [], 0
    while offset < flat.numel():
        for name, values, exact in candidates:
            piece = flat[offset : offset + values.numel()]
            if piece.numel() != values.numel() or not values.numel():
                continue
            values = values.to(piece.dtype)
            if (
                torch.equal(piece, values)
                if exact
                else torch.allclose(piece, values, rtol=1e-6, atol=0.0)
            ):
                names.append(name)
                offset += values.numel()
                break
        else:
            names.append("other")
            break
    return names


@case
def gradients_of_a_shard(student, ctx, frozen: bool = False, arguments: dict | None = None):
    """A small network on each rank, its shard of a batch of 24 through it and back, then
    the student's function (in groups of 2, 3 and 4)."""
    return in_every_size(
        functools.partial(gradients_body, seed=ctx.seed, frozen=frozen, **(arguments or {})),
        student,
    )


with_a_frozen_layer = gradients_of_a_shard.using(
    "with_a_frozen_layer",
    "The same, with the network's first layer frozen (its parameters have no gradient).",
    frozen=True,
)


# ---- judging ------------------------------------------------------------------------------


def plain(value):
    return value.value if isinstance(value, SeenTensor) else value


def hint_for(grads: list, local: list, expected: list, calls: list[dict], n: int) -> str | None:
    """Name the mistake behind gradients that are not the mean, where it is a known one."""
    pairs = [(plain(g), plain(e)) for g, e in zip(grads, expected, strict=False) if e is not None]
    tensors = all(isinstance(g, torch.Tensor) and g.shape == e.shape for g, e in pairs)
    if tensors and all(torch.allclose(g, e * n, rtol=1e-4, atol=1e-6) for g, e in pairs):
        return SUMMED_HINT
    if any(name.startswith("param") for c in calls for name in c.get("of", [])):
        return WEIGHTS_HINT
    mine = [(plain(g), plain(m)) for g, m in zip(grads, local, strict=False) if m is not None]
    if mine and all(isinstance(g, torch.Tensor) and torch.equal(g, m) for g, m in mine):
        return UNCHANGED_HINT
    return None


def expect_mean_gradients(seen: list[dict], ctx, frozen: bool = False) -> None:
    """Fail unless every rank's gradients equal those of one process on the whole batch."""
    expected = whole_batch_gradients(ctx.seed, frozen)
    for n, ranks in groups_finished(seen):
        for rank, result in enumerate(ranks):
            grads, calls = result["grads"], result["calls"]
            hint = hint_for(grads, result["local"], expected, calls, n)
            for i, (g, e) in enumerate(zip(grads, expected, strict=True)):
                label = _("with {n} processes, rank {rank}'s gradient of parameter {i}").format(
                    n=n, rank=rank, i=i
                )
                if e is None:
                    continue
                if g is None:
                    raise Fail(_("{label} is None: it was removed").format(label=label), hint)
                expect_close(g, e, label, hint, rtol=1e-4, atol=1e-6)


@check_on(gradients_of_a_shard, points=4, hint=MEAN_HINT)
def gradients_are_the_mean_over_ranks(seen, ctx):
    """Every rank ends with the gradients of one process that ran the whole batch.
    Property: the mean gradients; against the reference (one process's gradients on the whole
    batch)."""
    expect_mean_gradients(seen, ctx)


@check_on(
    with_a_frozen_layer,
    points=2,
    hint="A frozen parameter (requires_grad False) has no gradient: param.grad is None. "
    "Skip it (if param.grad is not None), as DDP does, and average the others.",
)
def skips_frozen_parameters(seen, ctx):
    """With the first layer frozen, its gradients stay None and the others are averaged.
    Property: frozen parameters are skipped; against the reference (None for the frozen layer, one
    process's whole-batch gradients for the others)."""
    with charged_by(MEAN):  # means wrong with or without a frozen layer: charged there
        expect_mean_gradients(seen, ctx, frozen=True)
    for n, ranks in groups_finished(seen):
        for rank, result in enumerate(ranks):
            for i in (0, 1):
                expect(
                    result["grads"][i] is None,
                    _(
                        "with {n} processes, rank {rank}: the frozen parameter {i} has a gradient "
                        "now; it must stay None"
                    ).format(n=n, rank=rank, i=i),
                )


@check_on(
    gradients_of_a_shard,
    points=1,
    hint="Call dist.all_reduce once per parameter, on param.grad itself: this is the naive "
    "version that the bucketed exercise improves on.",
)
def one_all_reduce_per_parameter(seen, ctx):
    """One dist.all_reduce per parameter, each on that parameter's gradient.
    Property: one all_reduce per gradient; against the reference (the exercise's rule, read from the
    recorded calls: one call on each parameter's gradient)."""
    with charged_by(MEAN):  # calls on the weights or on copies also make the means wrong
        expect_one_call_per_gradient(seen)


def expect_one_call_per_gradient(seen: list[dict]) -> None:
    """Fail unless every rank called all_reduce once on each parameter's gradient."""
    for n, ranks in groups_finished(seen):
        for rank, result in enumerate(ranks):
            reduced = [c for c in result["calls"] if c["name"] == "all_reduce"]
            wanted = [f"grad {i}" for i in range(len(result["grads"]))]
            got = [name for c in reduced for name in c.get("of", ["other"])]
            expect(
                sorted(got) == sorted(wanted) and len(reduced) == len(wanted),
                _(
                    "with {n} processes, rank {rank} called all_reduce {count} times, on {got}; "
                    "expected once on each of {wanted} gradients"
                ).format(n=n, rank=rank, count=len(reduced), got=got, wanted=len(wanted)),
            )


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "NoneType" in raised.message or "Expected parameter `tensor`" in raised.message:
        return _(
            "A frozen parameter (requires_grad False) has no gradient: param.grad is None. "
            "Skip it (if param.grad is not None) and average the others."
        )
    return None
