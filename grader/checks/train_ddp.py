"""Public checks of `train_ddp(net, num_epochs, batch_size, lr, data=None, device=None)`:
training with DistributedDataParallel, a DistributedSampler and SGD in every rank.

Each case runs in groups of 2, 3 and 4 processes (grader.ranks). Every rank gets a small
network (a different one on each rank: DDP's first broadcast must make them equal), a small
dataset that notes which examples are fetched, and a global batch of 24. The checks then
replay the run in the grader's own process: one network, from the weights the ranks started
with, trained with plain SGD on the global batches the ranks saw together (each step's
loss the mean of the ranks' losses, as DDP's averaged gradients make it). Every rank must end
with the replay's weights, as CS336's checks of a DDP run do.
"""

import functools
import re

import torch
import torch.distributed as dist
from torch import nn

from grader.api import case, check, error_hints, expect, expect_close, returned
from grader.fixtures import quiet_plots, sgd_step
from grader.ranks import apart, groups_finished, in_every_size, in_rank
from grader.sandbox.transport import SeenTensor

TRAIN, TEST = 96, 48  # examples; 2, 3 and 4 ranks split both evenly
BATCH, EPOCHS, LR = 24, 2, 0.5


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


class NotedDataset(torch.utils.data.Dataset):
    """A dataset of (input, label) pairs that notes each example handed out."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, tag: str, log: list) -> None:
        self.X, self.y, self.tag, self.log = X, y, tag, log

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index):
        self.log.append((self.tag, int(index)))
        return self.X[index], self.y[index]


def state(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").clone() for k, v in net.state_dict().items()}


def training_body(student, seed: int, num_epochs: int, batch_size: int, lr: float):
    """Return what each rank runs: the student's train_ddp on noted data, recording the
    examples each training step used, the weights at the first step and at the end."""

    def body():
        rank = dist.get_rank()
        torch.manual_seed(seed * 13 + rank)  # ranks start from different random states
        net = ddp_net(seed + rank)
        log: list = []
        first: dict = {}

        def note_forward(module, inputs):
            log.append(("forward", bool(module.training), int(len(inputs[0]))))
            if module.training and not first:
                first.update(state(module))

        net.register_forward_pre_hook(note_forward)
        sets = dataset_tensors(seed)
        data = (
            NotedDataset(*sets["train"], "train", log),
            NotedDataset(*sets["test"], "test", log),
        )
        with quiet_plots(student, []):
            outcome = in_rank(lambda: student.fn(net, num_epochs, batch_size, lr, data=data))
        history = outcome["returned"]
        outcome["returned"] = (
            [float(a) for a in history]
            if isinstance(history, list | tuple)
            and all(isinstance(a, int | float | torch.Tensor) for a in history)
            else {"type": type(history).__name__}
        )
        return {**outcome, "log": log, "first": first, "final": state(net)}

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


def training_steps(log: list) -> list[list[int]]:
    """Return the training examples each training forward pass used, in order (the examples
    fetched since the pass before)."""
    steps, fetched = [], []
    for event in log:
        if event[0] == "train":
            fetched.append(int(event[1]))
        elif event[0] == "forward":
            if event[1]:
                steps.append(fetched)
            fetched = []
    return steps


def epochs_of(log: list, num_epochs: int) -> list[list[int]]:
    """Return the training examples of each epoch, cutting the steps into equal parts."""
    steps = training_steps(log)
    per = max(1, len(steps) // num_epochs)
    return [sum(steps[e * per : (e + 1) * per], []) for e in range(num_epochs)]


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
    ranks' mean losses), with plain SGD; return it."""
    net.load_state_dict(plain_state(ranks[0]["first"]))
    steps = [training_steps(r["log"]) for r in ranks]
    for shares in zip(*steps, strict=False):
        net.zero_grad()
        losses = [nn.functional.cross_entropy(net(X[idx]), y[idx]) for idx in shares if idx]
        (sum(losses) / len(shares)).backward()
        sgd_step(net.parameters(), lr)
    return net


def test_accuracy(weights: dict, seed: int) -> float:
    net = ddp_net(seed)
    net.load_state_dict(plain_state(weights))
    X, y = dataset_tensors(seed)["test"]
    with torch.no_grad():
        return float((net(X).argmax(dim=1) == y).float().mean())


def finished_runs(seen) -> list[tuple[int, list[dict]]]:
    """Return (world size, ranks) for every group whose ranks all returned."""
    groups = groups_finished(seen)
    for _n, ranks in groups:
        for rank in ranks:
            returned(rank)
    return groups


@check(
    training_run,
    points=2,
    hint="Wrap the network in DistributedDataParallel after initialising it (DDP copies rank "
    "0's weights to every rank when it is built), and step only through the wrapped model's "
    "optimizer: then every rank keeps the same weights.",
)
def ranks_end_with_identical_parameters(seen, ctx):
    """After training, every rank holds the same weights."""
    for n, ranks in finished_runs(seen):
        zero = plain_state(ranks[0]["final"])
        for rank, result in enumerate(ranks[1:], start=1):
            for name, value in plain_state(result["final"]).items():
                expect_close(
                    value, zero[name], f"with {n} processes, rank {rank}'s {name} against rank 0's"
                )


@check(
    training_run,
    points=3,
    hint="Each step: zero the gradients, compute the loss of the wrapped model (model(X), "
    "not net(X)) on the rank's batch, backward, then optimizer.step() with "
    "torch.optim.SGD(model.parameters(), lr): DDP averages the gradients during backward.",
    after="ranks_end_with_identical_parameters",
)
def matches_one_process_on_the_same_global_batches(seen, ctx):
    """The weights equal one process's, trained by SGD on the global batches the ranks saw."""
    for n, ranks in finished_runs(seen):
        expect(ranks[0]["first"], f"with {n} processes, no training step ran")
        single = replay(ranks, ctx.seed, LR)
        for name, value in single.items():
            expect_close(
                ranks[0]["final"][name],
                value,
                f"with {n} processes, {name} against one process on the same global batches",
                rtol=1e-4,
                atol=1e-5,
            )


@check(
    training_run,
    points=2,
    hint="Give the training DataLoader a DistributedSampler(train_set): it hands each rank "
    "its own 1/world_size of the examples; without it every rank trains on the whole set.",
)
def each_rank_trains_on_its_own_shard(seen, ctx):
    """In each epoch, the ranks' training examples do not overlap and cover the set."""
    for n, ranks in finished_runs(seen):
        epochs = [epochs_of(r["log"], EPOCHS) for r in ranks]
        for e in range(EPOCHS):
            shares = [set(per[e]) for per in epochs]
            together = set().union(*shares)
            expect(
                sum(map(len, shares)) == len(together),
                f"with {n} processes, in epoch {e + 1} the ranks trained on the same examples "
                f"({sum(map(len, shares))} fetched, {len(together)} different)",
            )
            expect(
                len(together) == TRAIN,
                f"with {n} processes, epoch {e + 1} used {len(together)} of {TRAIN} examples",
            )


@check(
    training_run,
    points=1,
    hint="batch_size is the global batch: each rank's DataLoader takes batch_size // "
    "world_size examples per step, so that the ranks together make one batch of batch_size.",
)
def each_rank_takes_its_share_of_the_global_batch(seen, ctx):
    """Each training step of a rank uses batch_size / world_size examples."""
    for n, ranks in finished_runs(seen):
        for rank, result in enumerate(ranks):
            sizes = sorted({e[2] for e in result["log"] if e[0] == "forward" and e[1]})
            expect(
                sizes == [BATCH // n],
                f"with {n} processes and batch_size={BATCH}, rank {rank}'s steps took {sizes} "
                f"examples; its share is {BATCH // n}",
            )


@check(
    training_run,
    points=1,
    hint="Call sampler.set_epoch(epoch) at the start of every epoch (with shuffle=True, the "
    "default): DistributedSampler shuffles from the epoch number, so without it every epoch "
    "visits the examples in the same order.",
)
def shuffles_differently_each_epoch(seen, ctx):
    """Each rank sees its examples in another order in the second epoch than in the first."""
    for n, ranks in finished_runs(seen):
        for rank, result in enumerate(ranks):
            first, second = epochs_of(result["log"], EPOCHS)[:2]
            expect(
                first != second,
                f"with {n} processes, rank {rank} saw the same examples in the same order in "
                "both epochs",
            )


@check(
    training_run,
    points=1,
    hint="Initialise as the book does before training: nn.init.normal_(m.weight, std=0.01) for "
    "every nn.Linear and nn.Conv2d (net.apply(init_weights)).",
)
def initialises_weights_as_the_book(seen, ctx):
    """At the first step, the linear layers' weights have a standard deviation near 0.01."""
    for n, ranks in finished_runs(seen):
        weights = plain_state(ranks[0]["first"])
        expect(weights, f"with {n} processes, no training step ran")
        for name in ("1.weight", "3.weight"):
            spread = float(weights[name].std())
            expect(
                0.005 < spread < 0.02,
                f"with {n} processes, {name} started with a standard deviation of "
                f"{spread:.4f}; the book's initialisation gives 0.01",
            )


@check(
    training_run,
    points=1,
    hint="Return the list of test accuracies, one per epoch, each from "
    "evaluate_accuracy_distributed on the rank's shard of the test set (the same on every "
    "rank).",
)
def returns_the_test_accuracy_per_epoch(seen, ctx):
    """Every rank returns a list of one accuracy per epoch, the last that of the final weights
    on the whole test set."""
    for n, ranks in finished_runs(seen):
        for rank, result in enumerate(ranks):
            history = returned(result)
            expect(
                isinstance(history, list) and len(history) == EPOCHS,
                f"with {n} processes, rank {rank} returned {history!r}; expected a list of "
                f"{EPOCHS} accuracies",
            )
            wanted = test_accuracy(ranks[0]["final"], ctx.seed)
            expect(
                abs(history[-1] - wanted) < 1e-6,
                f"with {n} processes, rank {rank}'s last accuracy is {history[-1]:.4f}; the "
                f"final weights score {wanted:.4f} on the whole test set",
            )


SUMMARY = re.compile(r"test acc:?\s*[0-9.]+.*sec/epoch", re.IGNORECASE)


@check(
    training_run,
    points=1,
    hint="Print the summary line once, on rank 0 only (if dist.get_rank() == 0): "
    "print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch on ...').",
)
def rank_zero_alone_prints_the_summary(seen, ctx):
    """Rank 0 prints `test acc: ..., ... sec/epoch ...`; the other ranks print no summary."""
    finished_runs(seen)
    for group in seen:
        n, outputs = group["world_size"], group["outputs"]
        expect(
            bool(SUMMARY.search(outputs[0])),
            f"with {n} processes, rank 0 printed no summary line: {outputs[0][-200:]!r}",
        )
        for rank, text in enumerate(outputs[1:], start=1):
            expect(
                not SUMMARY.search(text),
                f"with {n} processes, rank {rank} printed a summary line too",
            )


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "set_epoch" in raised.message:
        return "set_epoch belongs to the DistributedSampler: keep a name for it."
    if "DistributedDataParallel" in raised.message and "device_ids" in raised.message:
        return "On the CPU (gloo), build DDP without device_ids: DDP(net) on the CPU."
    return None
