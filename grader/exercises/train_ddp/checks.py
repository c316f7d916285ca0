"""Public checks of `train_ddp(net, num_epochs, batch_size, lr, data=None, device=None)`:
training with DistributedDataParallel, a DistributedSampler and SGD in every rank.

Each case runs in groups of 2, 3 and 4 processes (grader.ranks). Every rank gets a small
network (a different one on each rank: DDP's first broadcast must make them equal), a small
dataset, and a global batch of 24. A `RunLog` notes what reached the network: the examples of
each training forward pass (known by their values, so loader workers, pinned memory and a
batch read outside the loop change nothing) and the settings of each optimizer step. The
checks then replay the run in the grader's own process: one network, from the weights the
ranks started with, trained with SGD (the settings the ranks' optimizer used) on the global
batches the ranks stepped on together (each step's loss the mean of the ranks' losses, as
DDP's averaged gradients make it). Every rank must end with the replay's weights, as CS336's
checks of a DDP run do.
"""

import functools
import re

import torch
import torch.distributed as dist
from torch import nn

from grader.api import (
    SGD_SETTINGS,
    GroupSeen,
    RankSeen,
    RunLog,
    SeenTensor,
    _,
    apart,
    case,
    charged_by,
    check_on,
    error_hints,
    every_group,
    every_rank,
    expect,
    expect_close,
    in_every_size,
    in_rank,
    quiet_plots,
    returned,
    sgd_update,
    state,
)

TRAIN, TEST = 96, 48  # examples; 2, 3 and 4 ranks split both evenly
BATCH, EPOCHS, LR = 24, 2, 0.5
DEADLOCK_OWNER = "ranks_end_with_identical_parameters"  # charges a run that never ends


def ddp_net(seed: int) -> nn.Sequential:
    """Return the checks' small network for 1x8x8 inputs and four classes."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4))


def dataset_tensors(seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Return the inputs and labels of the training and test sets for a seed: labels that a
    small network can learn (the sign pattern of four pixel sums)."""
    gen = torch.Generator().manual_seed(seed + 7)
    sets = {}
    for name, n in (("train", TRAIN), ("test", TEST)):
        X = torch.randn(n, 1, 8, 8, generator=gen)
        halves = X.flatten(1).view(n, 2, 32).sum(dim=2)
        y = (halves[:, 0] > 0).long() * 2 + (halves[:, 1] > 0).long()
        sets[name] = (X, y)
    return sets


def training_body(student, seed: int, num_epochs: int, batch_size: int, lr: float):
    """Return what each rank runs: the student's train_ddp on the checks' data, noting the run
    (see RunLog) and the weights at the end."""

    def body():
        rank = dist.get_rank()
        torch.manual_seed(seed * 13 + rank)  # ranks start from different random states
        net = ddp_net(seed + rank)
        sets = dataset_tensors(seed)
        run = RunLog(net, sets["train"][0])
        data = (
            torch.utils.data.TensorDataset(*sets["train"]),
            torch.utils.data.TensorDataset(*sets["test"]),
        )
        try:
            with quiet_plots(student, []):
                outcome = in_rank(lambda: student.fn(net, num_epochs, batch_size, lr, data=data))
        finally:
            run.close()
        history = outcome.returned
        accuracies = (
            [float(a) for a in history]
            if isinstance(history, list | tuple)
            and all(isinstance(a, int | float | torch.Tensor) for a in history)
            else {"type": type(history).__name__}
        )
        return {
            "returned": accuracies,
            "raised": outcome.raised,
            "at": outcome.at,
            "log": run.log,
            "first": run.first,
            "final": state(net),
        }

    return body


@case(holds=("evaluate_accuracy_distributed",))
def training_run(student, ctx, num_epochs: int = EPOCHS, batch_size: int = BATCH, lr: float = LR):
    """A small network trained for two epochs on 96 examples, global batch 24, in groups of
    2, 3 and 4 processes (with the reference's evaluate_accuracy_distributed, where it is
    at hand, so that a wrong one costs only its own checks)."""
    return in_every_size(
        functools.partial(
            training_body,
            seed=ctx.seed,
            num_epochs=num_epochs,
            batch_size=batch_size,
            lr=lr,
        ),
        student,
    )


# ---- judging ------------------------------------------------------------------------------


def training_steps(log: list[dict]) -> list[list[int]]:
    """Return the training examples of each optimizer step, in order: those of the training
    forward passes (with gradients on) since the step before. A run that noted no optimizer
    step (one that updates the weights itself) counts each such pass as a step."""
    stepped = any(e["event"] == "step" for e in log)
    steps, pending = [], []
    for e in log:
        if e["event"] == "forward" and e["training"]:
            if stepped:
                pending += e["examples"]
            else:
                steps.append(list(e["examples"]))
        elif e["event"] == "step":
            steps.append(pending)
            pending = []
    return steps


def step_sizes(log: list[dict]) -> list[int]:
    """Return the batch sizes of the training forward passes."""
    return sorted({e["size"] for e in log if e["event"] == "forward" and e["training"]})


def epochs_of(log: list[dict], num_epochs: int) -> list[list[int]]:
    """Return the training examples of each epoch, cutting the steps into equal parts."""
    steps = training_steps(log)
    per = max(1, len(steps) // num_epochs)
    return [sum(steps[e * per : (e + 1) * per], []) for e in range(num_epochs)]


def sgd_settings(log: list[dict]) -> dict:
    """Return the settings of torch.optim.SGD that the run's first optimizer step used (the
    defaults where it noted none)."""
    step = next((e for e in log if e["event"] == "step"), {})
    found = {k: step.get(k, default) for k, default in SGD_SETTINGS.items()}
    return {k: v if v is not None else SGD_SETTINGS[k] for k, v in found.items()}


def plain_state(saved: dict) -> dict[str, torch.Tensor]:
    return {k: v.value if isinstance(v, SeenTensor) else v for k, v in saved.items()}


def replay(ranks: list[dict], seed: int, lr: float) -> dict[str, torch.Tensor]:
    """Return the weights of the checks' network trained as the group trained it (see
    `replay_on`; computed apart, as grader.ranks.apart explains)."""
    return apart(_replay, ranks, seed, lr)


def _replay(ranks: list[dict], seed: int, lr: float) -> dict[str, torch.Tensor]:
    return state(replay_on(ranks, ddp_net(seed), *dataset_tensors(seed)["train"], lr))


def replay_on(
    ranks: list[dict], net: nn.Module, X: torch.Tensor, y: torch.Tensor, lr: float
) -> nn.Module:
    """Train `net` in this one process as a group of ranks did: from rank 0's weights at its
    first step, on the examples each rank used at each step (each step's loss the mean of the
    ranks' mean losses), with SGD at `lr` and the other settings the ranks' optimizer had
    (momentum, weight decay); return it."""
    net.load_state_dict(plain_state(ranks[0]["first"]))
    steps = [training_steps(r["log"]) for r in ranks]
    settings, momentum = sgd_settings(ranks[0]["log"]), {}
    for shares in zip(*steps, strict=False):
        if not any(shares):
            continue
        net.zero_grad()
        losses = [nn.functional.cross_entropy(net(X[idx]), y[idx]) for idx in shares if idx]
        (sum(losses) / len(shares)).backward()
        sgd_update(list(net.parameters()), lr, momentum, **settings)
    return net


def test_accuracy(weights: dict, seed: int) -> float:
    net = ddp_net(seed)
    net.load_state_dict(plain_state(weights))
    X, y = dataset_tensors(seed)["test"]
    with torch.no_grad():
        return float((net(X).argmax(dim=1) == y).float().mean())


def finished_runs(seen) -> list[GroupSeen]:
    """Return every group, all of whose ranks returned (a rank that raised fails)."""
    groups = every_group(seen)
    for g in groups:
        for record in g.ranks.values():
            returned(record)
    return groups


def expect_the_given_optimizer(r: RankSeen, lr: float) -> None:
    """Fail unless the rank stepped with torch.optim.SGD at learning rate `lr` and trained on
    examples of the training set, as the replay assumes."""
    for e in r.record["log"]:
        if e["event"] != "step":
            continue
        expect(
            e["optimizer"] == "SGD",
            _(
                "with {n} processes, rank {rank} stepped with torch.optim.{optimizer}; the task "
                "asks for torch.optim.SGD"
            ).format(n=r.n, rank=r.rank, optimizer=e["optimizer"]),
            _("Train with torch.optim.SGD(model.parameters(), lr), as the book does."),
        )
        expect(
            e.get("maximize") in (None, False),
            _("with {n} processes, rank {rank}'s SGD maximizes the loss (maximize=True)").format(
                n=r.n, rank=r.rank
            ),
        )
        expect(
            e["lr"] is not None and abs(e["lr"] - lr) <= 1e-9 * max(1.0, abs(lr)),
            _(
                "with {n} processes, rank {rank}'s optimizer stepped with learning rate "
                "{used:g}; the task gives lr={lr:g}"
            ).format(n=r.n, rank=r.rank, used=e["lr"], lr=lr),
            _(
                "Give the optimizer the lr that train_ddp was called with, unchanged (no "
                "scaling by the number of processes, no schedule)."
            ),
        )
    unknown = sum(idx < 0 for step in training_steps(r.record["log"]) for idx in step)
    expect(
        not unknown,
        _(
            "with {n} processes, {unknown} of the inputs that reached rank {rank}'s network "
            "were not examples of the training set as given (changed on the way?)"
        ).format(n=r.n, unknown=unknown, rank=r.rank),
        _(
            "Feed the network the batches of the training DataLoader as they come, moved to "
            "the device and nothing else."
        ),
    )


@check_on(
    training_run,
    points=2,
    hint="Wrap the network in DistributedDataParallel after initialising it (DDP copies rank "
    "0's weights to every rank when it is built), and step only through the wrapped model's "
    "optimizer: then every rank keeps the same weights.",
)
def ranks_end_with_identical_parameters(seen, ctx):
    """After training, every rank holds the same weights.
    Property: the ranks agree; a relation: every rank's final weights against rank 0's."""
    for g in finished_runs(seen):
        zero = plain_state(g.ranks[0]["final"])
        for rank, result in list(g.ranks.items())[1:]:
            for name, value in plain_state(result["final"]).items():
                expect_close(
                    value,
                    zero[name],
                    _("with {n} processes, rank {rank}'s {name} against rank 0's").format(
                        n=g.n, rank=rank, name=name
                    ),
                )


@check_on(
    training_run,
    points=3,
    hint="Each step: zero the gradients, compute the loss of the wrapped model (model(X), "
    "not net(X)) on the rank's batch, backward, then optimizer.step() with "
    "torch.optim.SGD(model.parameters(), lr): DDP averages the gradients during backward.",
    after="ranks_end_with_identical_parameters",
    because="one process's weights compare with the ranks' only where the ranks agree",
)
def matches_one_process_on_the_same_global_batches(seen, ctx):
    """The weights equal one process's, trained by SGD on the global batches the ranks saw.
    Property: the training step; against the reference (one process replaying the ranks' global
    batches with plain SGD)."""
    for g in finished_runs(seen):
        expect(g.ranks[0]["first"], _("with {n} processes, no training step ran").format(n=g.n))
        for r in g.each_rank():
            expect_the_given_optimizer(r, LR)
        single = replay(list(g.ranks.values()), ctx.seed, LR)
        for name, value in single.items():
            expect_close(
                g.ranks[0]["final"][name],
                value,
                _(
                    "with {n} processes, {name} against one process on the same global batches"
                ).format(n=g.n, name=name),
                rtol=1e-4,
                atol=1e-5,
            )


@check_on(
    training_run,
    points=2,
    hint="Give the training DataLoader a DistributedSampler(train_set): it hands each rank "
    "its own 1/world_size of the examples; without it every rank trains on the whole set.",
)
def each_rank_trains_on_its_own_shard(seen, ctx):
    """In each epoch, the ranks' training examples do not overlap and cover the set.
    Property: each rank its own shard; a relation: the ranks' examples of an epoch against one
    another (no overlap), and together against the training set (all of it)."""
    for g in every_group(seen, see=DEADLOCK_OWNER):
        epochs = {r: epochs_of(result["log"], EPOCHS) for r, result in g.ranks.items()}
        for e in range(EPOCHS):
            shares = [set(per[e]) for per in epochs.values()]
            together = set().union(*shares)
            expect(
                sum(map(len, shares)) == len(together),
                _(
                    "with {n} processes, in epoch {epoch} the ranks trained on the same examples "
                    "({used} used, {different} different)"
                ).format(n=g.n, epoch=e + 1, used=sum(map(len, shares)), different=len(together)),
            )
            expect(
                len(g.ranks) < g.n or len(together) == TRAIN,  # (a deadlock left some ranks)
                _("with {n} processes, epoch {epoch} used {used} of {total} examples").format(
                    n=g.n, epoch=e + 1, used=len(together), total=TRAIN
                ),
            )


@check_on(
    training_run,
    points=1,
    hint="batch_size is the global batch: each rank's DataLoader takes batch_size // "
    "world_size examples per step, so that the ranks together make one batch of batch_size.",
)
def each_rank_takes_its_share_of_the_global_batch(seen, ctx):
    """Each training step of a rank uses batch_size / world_size examples.
    Property: each rank's share of the batch; against the reference (batch_size // world_size
    examples per step)."""
    for r in every_rank(seen, see=DEADLOCK_OWNER):
        sizes = step_sizes(r.record["log"])
        expect(
            sizes == [BATCH // r.n],
            _(
                "with {n} processes, rank {rank}'s steps took {sizes} examples; its share of "
                "batch_size={batch} is {share}"
            ).format(n=r.n, rank=r.rank, sizes=sizes, batch=BATCH, share=BATCH // r.n),
        )


@check_on(
    training_run,
    points=1,
    hint="Call sampler.set_epoch(epoch) at the start of every epoch (with shuffle=True, the "
    "default): DistributedSampler shuffles from the epoch number, so without it every epoch "
    "visits the examples in the same order.",
)
def shuffles_differently_each_epoch(seen, ctx):
    """Each rank sees its examples in another order in the second epoch than in the first.
    Property: a new order each epoch; a relation: a rank's second epoch against its first."""
    for r in every_rank(seen, see=DEADLOCK_OWNER):
        first, second = epochs_of(r.record["log"], EPOCHS)[:2]
        expect(
            first != second,
            _(
                "with {n} processes, rank {rank} saw the same examples in the same order in both "
                "epochs"
            ).format(n=r.n, rank=r.rank),
        )


@check_on(
    training_run,
    points=1,
    hint="Initialise as the book does before training: nn.init.normal_(m.weight, std=0.01) for "
    "every nn.Linear and nn.Conv2d (net.apply(init_weights)).",
)
def initialises_weights_as_the_book(seen, ctx):
    """At the first step, the linear layers' weights have a standard deviation near 0.01.
    Property: the initialisation; against the reference (the book's standard deviation, 0.01)."""
    for g in every_group(seen, see=DEADLOCK_OWNER):
        rank = min(g.ranks)
        weights = plain_state(g.ranks[rank]["first"])
        expect(
            weights,
            _("with {n} processes, rank {rank} took no training step").format(n=g.n, rank=rank),
        )
        for name in ("1.weight", "3.weight"):
            spread = float(weights[name].std())
            expect(
                0.005 < spread < 0.02,
                _(
                    "with {n} processes, {name} started with a standard deviation of "
                    "{spread:.4f}; the book's initialisation gives 0.01"
                ).format(n=g.n, name=name, spread=spread),
            )


@check_on(
    training_run,
    points=1,
    hint="Return the list of test accuracies, one per epoch, each from "
    "evaluate_accuracy_distributed on the rank's shard of the test set (the same on every "
    "rank).",
)
def returns_the_test_accuracy_per_epoch(seen, ctx):
    """Every rank returns a list of one accuracy per epoch, the last that of the final weights
    on the whole test set.
    Property: the history returned; against the reference (one accuracy per epoch, the last that of
    the final weights on the test set)."""
    with charged_by(DEADLOCK_OWNER):  # a run that never ends, or collectives that differ
        groups = finished_runs(seen)
    for r in (r for g in groups for r in g.each_rank()):
        history = returned(r.record)
        expect(
            isinstance(history, list) and len(history) == EPOCHS,
            _(
                "with {n} processes, rank {rank} returned {history!r}; expected a list of "
                "{epochs} accuracies"
            ).format(n=r.n, rank=r.rank, history=history, epochs=EPOCHS),
        )
        wanted = test_accuracy(r.group[0]["final"], ctx.seed)
        agree = all(same_weights(other["final"], r.group[0]["final"]) for other in r.group.values())
        expect(
            abs(history[-1] - wanted) < 1e-6,
            _(
                "with {n} processes, rank {rank}'s last accuracy is {last:.4f}; the final "
                "weights score {wanted:.4f} on the whole test set"
            ).format(n=r.n, rank=r.rank, last=history[-1], wanted=wanted),
            # ranks whose weights differ score differently: that check charges it
            see=None if agree else DEADLOCK_OWNER,
        )


def same_weights(one: dict, other: dict) -> bool:
    """Return True when two ranks' saved weights are the same."""
    a, b = plain_state(one), plain_state(other)
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)


# The summary line, as the English notebook prints it or as the Chinese one does.
SUMMARY = re.compile(
    r"test acc:?\s*[0-9.]+.*sec/epoch|测试精度[:：]\s*[0-9.]+.*秒/轮", re.IGNORECASE
)


@check_on(
    training_run,
    points=1,
    hint="Print the summary line once, on rank 0 only (if dist.get_rank() == 0): "
    "print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch on ...').",
)
def rank_zero_alone_prints_the_summary(seen, ctx):
    """Rank 0 prints `test acc: ..., ... sec/epoch ...`; the other ranks print no summary.
    Property: the summary line; against the reference (the book's line, on rank 0 alone)."""
    outputs = {g["world_size"]: g["outputs"] for g in seen}
    for r in every_rank(seen, see=DEADLOCK_OWNER):
        printed = bool(SUMMARY.search(outputs[r.n][r.rank]))
        if r.rank == 0:
            expect(
                printed,
                _("with {n} processes, rank {rank} printed no summary line: {output!r}").format(
                    n=r.n, rank=r.rank, output=outputs[r.n][0][-200:]
                ),
            )
        else:
            expect(
                not printed,
                _("with {n} processes, rank {rank} printed a summary line too").format(
                    n=r.n, rank=r.rank
                ),
            )


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "set_epoch" in raised.message:
        return _("set_epoch belongs to the DistributedSampler: keep a name for it.")
    if "DistributedDataParallel" in raised.message and "device_ids" in raised.message:
        return _("On the CPU (gloo), build DDP without device_ids: DDP(net) on the CPU.")
    return None
