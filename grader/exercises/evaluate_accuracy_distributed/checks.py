"""Public checks of `evaluate_accuracy_distributed(net, test_iter, device)`: each rank counts
the correct predictions on its own shard, the counts are summed over the ranks, and every
rank returns the accuracy of the whole test set.

Each case runs in groups of 2, 3 and 4 processes (grader.ranks). The network is a stand-in
whose scores are its input, so the grader knows every prediction: it builds each rank's
shard from the seed, and counts the whole set's accuracy itself.
"""

import functools

import torch
import torch.distributed as dist
from torch import nn

from grader.api import (
    N_,
    _,
    case,
    charged_by,
    check_on,
    error_hints,
    expect,
    groups_finished,
    in_every_size,
    in_rank,
    ranks_that_returned,
    recording_calls,
    returned,
)

COUNT_HINT = N_(
    "Count on each rank: the correct predictions (d2l.accuracy) and the number of examples, "
    "in one tensor; dist.all_reduce it, and divide the summed correct by the summed total."
)
WHOLE_SET = "every_rank_returns_the_accuracy_of_the_whole_set"  # against the counted accuracy
AVERAGED_HINT = N_(
    "Each rank's accuracy was averaged over the ranks; with shards of different sizes that is "
    "not the accuracy of the test set. Sum the counts (correct and total) over the ranks, "
    "then divide."
)


class Scores(nn.Module):
    """A stand-in network whose class scores are its input; it notes its mode at each call."""

    def __init__(self) -> None:
        super().__init__()
        self.modes: list[bool] = []

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        return X


def shard_sizes(shape: str, rank: int, world: int) -> list[int]:
    """Return the sizes of rank `rank`'s batches: "unequal" gives each rank a different
    number of examples, "equal" the same, "empty" leaves the last rank without any."""
    if shape == "equal":
        return [5, 5]
    if shape == "empty":
        return [] if rank == world - 1 else [6, 2 + rank]
    if shape == "skewed":
        return [1] if rank == 0 else [7] * (2 * rank)
    return [4] * (rank + 1) + [rank + 1]


def shard(seed: int, shape: str, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Return rank `rank`'s batches of scores and labels. Rank 0 predicts almost every label,
    later ranks fewer, so that averaging the ranks' accuracies differs from counting."""
    gen = torch.Generator().manual_seed(seed * 101 + rank)
    right = 0.9 - 0.6 * rank / max(1, world - 1)
    batches = []
    for size in shard_sizes(shape, rank, world):
        scores = torch.randn(size, 10, generator=gen)
        predicted = scores.argmax(dim=1)
        hit = torch.rand(size, generator=gen) < right
        batches.append((scores, torch.where(hit, predicted, (predicted + 1) % 10)))
    return batches


def counted_accuracy(seed: int, shape: str, world: int) -> float:
    """Return the accuracy of the whole test set: correct over total, across every shard."""
    correct = total = 0
    for rank in range(world):
        for scores, labels in shard(seed, shape, rank, world):
            correct += int((scores.argmax(dim=1) == labels).sum())
            total += len(labels)
    return correct / total


def averaged_accuracy(seed: int, shape: str, world: int) -> float:
    """Return the mean of the ranks' own accuracies: the known wrong answer."""
    accuracies = []
    for rank in range(world):
        batches = shard(seed, shape, rank, world)
        n = sum(len(y) for _, y in batches)
        if n:
            hits = sum(int((s.argmax(dim=1) == y).sum()) for s, y in batches)
            accuracies.append(hits / n)
    return sum(accuracies) / len(accuracies)


def accuracy_body(student, seed: int, shape: str):
    def body():
        rank, world = dist.get_rank(), dist.get_world_size()
        net = Scores().train()
        batches = shard(seed, shape, rank, world)
        with recording_calls(student.namespace) as calls:
            outcome = in_rank(lambda: student.fn(net, batches, torch.device("cpu")))
        value = outcome.returned
        return {
            "returned": {
                "type": type(value).__name__,
                "value": float(value) if isinstance(value, int | float | torch.Tensor) else None,
            },
            "raised": outcome.raised,
            "at": outcome.at,
            "modes": net.modes,
            "calls": [c["name"] for c in calls],
        }

    return body


@case
def shards(student, ctx, shape: str = "unequal"):
    """Each rank's own batches of scores and labels (rank r has 5 r + 5 examples), given to
    the student's function on the CPU, in groups of 2, 3 and 4."""
    return in_every_size(functools.partial(accuracy_body, seed=ctx.seed, shape=shape), student)


equal_shards = shards.using(
    "equal_shards", "Every rank has two batches of five examples.", shape="equal"
)
a_rank_without_data = shards.using(
    "a_rank_without_data", "The last rank's shard is empty; the others have two batches.",
    shape="empty",
)  # fmt: skip


def expect_accuracy(seen, ctx, shape: str) -> None:
    """Fail unless every rank returned the accuracy of the whole set."""
    for n, ranks in groups_finished(seen):
        wanted = counted_accuracy(ctx.seed, shape, n)
        averaged = averaged_accuracy(ctx.seed, shape, n)
        for rank, result in enumerate(ranks):
            got = returned(result)["value"]
            hint = AVERAGED_HINT if got is not None and abs(got - averaged) < 1e-6 else None
            expect(
                got is not None and abs(got - wanted) < 1e-6,
                _(
                    "with {n} processes, rank {rank} returned {got}; the test set's accuracy is "
                    "{wanted:.6f} (correct over total, across every rank's shard)"
                ).format(n=n, rank=rank, got=got, wanted=wanted),
                hint,
            )


@check_on(shards, points=3, hint=COUNT_HINT)
def every_rank_returns_the_accuracy_of_the_whole_set(seen, ctx):
    """With shards of different sizes, every rank returns correct / total over all shards.
    Property: the whole set's accuracy; against the reference (correct over total, counted by the
    grader across every shard)."""
    expect_accuracy(seen, ctx, "unequal")


@check_on(equal_shards, points=2, hint=COUNT_HINT)
def equal_shards_give_the_accuracy_of_the_whole_set(seen, ctx):
    """With shards of equal size, every rank returns the whole set's accuracy.
    Property: shards of equal size; against the reference (the accuracy counted across every
    shard)."""
    with charged_by(WHOLE_SET):  # wrong on unequal shards too: charged there
        expect_accuracy(seen, ctx, "equal")


@check_on(
    a_rank_without_data,
    points=1,
    hint="A rank whose shard is empty must still join the all_reduce (or the others wait for "
    "it forever) and must not divide by its own zero count: divide only the summed counts.",
)
def a_rank_without_data_still_takes_part(seen, ctx):
    """When the last rank has no examples, every rank still returns the whole set's accuracy.
    Property: a rank without data; against the reference (the accuracy counted across the other
    ranks' shards)."""
    with charged_by(WHOLE_SET):  # wrong where every rank has data too: charged there
        expect_accuracy(seen, ctx, "empty")


@check_on(
    shards,
    points=1,
    hint="Return a Python number: float(correct / total), not a tensor.",
)
def returns_a_python_float(seen, ctx):
    """The accuracy comes back as a float, as d2l.evaluate_accuracy_gpu's does.
    Property: the type returned; against the reference (a float, as d2l.evaluate_accuracy_gpu
    returns)."""
    with charged_by(WHOLE_SET):  # a deadlock or a crash: charged there
        groups = groups_finished(seen)
    for n, ranks in groups:
        for rank, result in enumerate(ranks):
            kind = returned(result)["type"]
            expect(
                kind == "float",
                _("with {n} processes, rank {rank} returned a {kind}").format(
                    n=n, rank=rank, kind=kind
                ),
            )


@check_on(
    shards,
    points=1,
    hint="Put the network in evaluation mode first (net.eval()), as d2l.evaluate_accuracy_gpu "
    "does: dropout and batch norm behave differently while training.",
)
def evaluates_in_eval_mode(seen, ctx):
    """Every forward pass runs with the network in evaluation mode (judged on the ranks that
    returned: a deadlock is charged by every_rank_returns_the_accuracy_of_the_whole_set).
    Property: evaluation mode; against the reference (eval mode, as the network noted it at every
    forward pass)."""
    for n, ranks in ranks_that_returned(
        seen, see="every_rank_returns_the_accuracy_of_the_whole_set"
    ):
        for rank, result in ranks.items():
            modes = result["modes"]
            ran = (
                _("with {n} processes, rank {rank}'s network ran no batch")
                if not modes
                else _("with {n} processes, rank {rank}'s network ran in training mode")
            )
            expect(modes and not any(modes), ran.format(n=n, rank=rank))


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if raised.type == "ZeroDivisionError" or "division by zero" in raised.message:
        return _(
            "A rank with an empty shard counted zero examples: divide only the counts summed "
            "over every rank."
        )
    return None
