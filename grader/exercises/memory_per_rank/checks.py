"""Public checks of `memory_per_rank(model, optimizer, stage, world_size)`: the bytes of
parameters, gradients and optimizer state that rank 0 holds, for DDP (stage 0) and ZeRO's
stages 1, 2 and 3.

The case builds small networks and optimizers that have taken one step, and asks the
student's function for every stage in groups of 1 to 4 ranks. The checks compare each answer
with the table of the notebook: P values that train, K values of state per value, and chunks
of ceil(P / N) values, times the bytes per value.
"""

from typing import NamedTuple

import torch
from torch import nn

from grader.api import N_, _, attempt, case, check, expect, finished, raised_in

STAGES = (0, 1, 2, 3)
SIZES = (1, 2, 3, 4)
STAGE_NAMES = {0: "DDP", 1: N_("ZeRO stage 1"), 2: N_("ZeRO stage 2"), 3: N_("ZeRO stage 3")}
# name (looked up in the reader's language): (class, settings, values of state per value).
# The judge reads K from here: building an optimizer imports torch._dynamo (0.8 s in a fresh
# process), which the grading children have from the warm server and the judge has not.
OPTIMIZERS = {
    "SGD": (torch.optim.SGD, {"lr": 0.1}, 0),
    N_("SGD with momentum"): (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, 1),
    "Adam": (torch.optim.Adam, {"lr": 0.01}, 2),
    N_("Adam with amsgrad"): (torch.optim.Adam, {"lr": 0.01, "amsgrad": True}, 3),
}
TABLE_HINT = N_(
    "Per rank: DDP holds P parameters, P gradients and K P values of state; stage 1 holds "
    "K ceil(P / N) of state, stage 2 also ceil(P / N) gradients, stage 3 also ceil(P / N) "
    "parameters. Multiply the values by the bytes of one (element_size())."
)
K_HINT = N_(
    "K is the optimizer's own: count the state tensors shaped like their parameter, so K is 2 "
    "for Adam, 1 for SGD with momentum (its buffer) and 0 for plain SGD (none)."
)
STEP_HINT = N_(
    "Count only the state tensors shaped like their parameter: Adam's scalar `step` counter is "
    "left out, so K is 2 for Adam, 1 for SGD with momentum and 0 for plain SGD."
)


def network(kind: str, seed: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Return a small network: "even" has 132 values that train (2, 3 and 4 divide it), "odd"
    25 (none does), "frozen" 54 that train beside a frozen layer and batch norm's buffers."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "even":
            net = nn.Sequential(nn.Linear(11, 8), nn.ReLU(), nn.Linear(8, 4))
        elif kind == "odd":
            net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        elif kind == "frozen":
            net = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 6))
            net[0].requires_grad_(False)
        else:
            raise ValueError(kind)
    return net.to(dtype)


def stepped(kind: str, optimizer: str, seed: int, dtype: torch.dtype = torch.float32):
    """Return a network and an optimizer over it that has taken one step (so it has state)."""
    net = network(kind, seed, dtype)
    cls, settings, _k = OPTIMIZERS[optimizer]
    trained = [p for p in net.parameters() if p.requires_grad]
    opt = cls(trained, **settings)
    for p in trained:
        p.grad = torch.ones_like(p)
    opt.step()
    return net, opt


class Table(NamedTuple):
    """What the notebook's table needs: P values that train, K values of state per value,
    and the bytes of a value."""

    total: int
    per_value: int
    size: int


def table(kind: str, optimizer: str, dtype: torch.dtype = torch.float32) -> Table:
    """Return the table's inputs for a network of the checks and an optimizer, known without
    building the optimizer."""
    trained = [p for p in network(kind, 0, dtype).parameters() if p.requires_grad]
    size = trained[0].element_size()
    return Table(sum(p.numel() for p in trained), OPTIMIZERS[optimizer][2], size)


def expected_bytes(t: Table, stage: int, world: int, floor: bool = False) -> int:
    """Return the notebook table's figure for rank 0 (with `floor`, with chunks of
    floor(P / N) values instead: a mistake)."""
    shard = t.total // world if floor else -(-t.total // world)
    held = (
        shard if stage >= 3 else t.total,
        shard if stage >= 2 else t.total,
        t.per_value * (shard if stage >= 1 else t.total),
    )
    return sum(held) * t.size


def key(stage: int, world: int) -> str:
    return f"{stage}:{world}"


@case
def every_stage(
    student,
    ctx,
    kind: str = "even",
    optimizers=("SGD", "SGD with momentum", "Adam"),
    dtype: str = "float32",
    sizes=SIZES,
):
    """A small network and each optimizer after one step; the function asked for every stage
    in groups of the sizes given."""
    seen = []
    for name in optimizers:
        net, opt = stepped(kind, name, ctx.seed, getattr(torch, dtype))
        answers = {}
        for stage in STAGES:
            for world in sizes:
                answers[key(stage, world)] = attempt(
                    lambda stage=stage, world=world, net=net, opt=opt: student.fn(
                        net, opt, stage, world
                    )
                )
        seen.append({"optimizer": name, "answers": answers})
    return seen


odd_length = every_stage.using(
    "odd_length",
    "The same with 25 values that train, which 2, 3 and 4 do not divide.",
    kind="odd",
    optimizers=("Adam",),
)
with_a_frozen_layer = every_stage.using(
    "with_a_frozen_layer",
    "A network with a frozen layer and batch norm's buffers, with Adam, in DDP.",
    kind="frozen",
    optimizers=("Adam",),
)


@case
def unknown_stages(student, ctx):
    """Stages that do not exist: 4 and -1."""
    net, opt = stepped("even", "Adam", ctx.seed)
    return [attempt(lambda stage=stage: student.fn(net, opt, stage, 2)) for stage in (4, -1)]


# ---- judging ------------------------------------------------------------------------------


def answer_of(outcome: dict):
    """Return what a call returned, or None where it raised or returned something else than a
    number."""
    if raised_in(outcome) is not None:
        return None
    got = outcome.get("returned")
    if isinstance(got, bool) or not isinstance(got, int | float):
        return None
    return got


def right(outcome: dict, t: Table, stage: int, world: int) -> bool:
    got = answer_of(outcome)
    return got is not None and got == expected_bytes(t, stage, world)


STAGE_CHECKS = {
    1: "stage_1_shards_the_optimizer_state",
    2: "stage_2_shards_the_gradients_too",
    3: "stage_3_shards_the_parameters_too",
}
CHUNK_CHECK = "rank_0_holds_the_largest_chunk"


def owner(got, t: Table, stage: int, world: int, ddp_right: bool, me: str) -> str | None:
    """Return the check that owns a wrong figure's cause, if another than `me`: DDP's where
    the student's DDP figure is wrong too, the chunk check where the figure is floor(P / N)'s,
    else the check of the stage."""
    if stage and not ddp_right:
        return "ddp_holds_everything_on_every_rank"
    if stage and got == expected_bytes(t, stage, world, floor=True):
        return None if me == CHUNK_CHECK else CHUNK_CHECK
    mine = STAGE_CHECKS.get(stage, "ddp_holds_everything_on_every_rank")
    return None if mine == me else mine


def expect_stage(
    seen,
    ctx,
    stage: int,
    me: str,
    kind: str = "even",
    dtype=torch.float32,
    sizes=SIZES,
    hint=TABLE_HINT,
) -> None:
    """Fail unless every answer for `stage` matches the table, naming the check that owns
    the cause where another does (`owner`); `me` is the check that asks."""
    calls = [o["answers"][key(stage, n)] for o in seen for n in sizes]
    finished(calls)  # every call raised: the check cannot judge
    for entry in seen:
        t = table(kind, entry["optimizer"], dtype)
        ddp_right = all(right(entry["answers"][key(0, n)], t, 0, n) for n in sizes)
        for world in sizes:
            outcome = entry["answers"][key(stage, world)]
            if raised_in(outcome) is not None or right(outcome, t, stage, world):
                continue
            got, name = answer_of(outcome), entry["optimizer"]
            expect(
                False,
                _(
                    "{stage} with {optimizer} over {n} ranks: returned {got}, expected {want} bytes"
                ).format(
                    stage=_(STAGE_NAMES[stage]),
                    optimizer=_(name),
                    n=world,
                    got=outcome.get("returned"),
                    want=expected_bytes(t, stage, world),
                ),
                hint,
                see=owner(got, t, stage, world, ddp_right, me),
            )


# The optimizers of the case that keep a scalar `step` counter per parameter tensor.
STEP_COUNTERS = ("Adam",)


def ddp_hint(seen, ctx) -> str:
    """Name the cause that a wrong DDP figure on one rank shows: Adam's step counters where
    Adam's is the table's plus one value per parameter tensor (a scalar counter each, in the
    parameters' bytes or in those of the float32 counter); another optimizer's K where a
    figure is the table's with another K; else the table."""
    counters = len([p for p in network("even", 0).parameters() if p.requires_grad])
    other_k = False
    for entry in seen:
        t = table("even", entry["optimizer"])
        got = answer_of(entry["answers"][key(0, 1)])
        if got is None or got == expected_bytes(t, 0, 1):
            continue
        if entry["optimizer"] in STEP_COUNTERS and got - expected_bytes(t, 0, 1) in {
            counters * t.size,
            counters * 4,
        }:
            return STEP_HINT
        other_k |= any(got == expected_bytes(t._replace(per_value=k), 0, 1) for k in range(4))
    return K_HINT if other_k else TABLE_HINT


@check(every_stage, points=2, hint=TABLE_HINT)
def ddp_holds_everything_on_every_rank(seen, ctx):
    """DDP: each rank holds P parameters, P gradients and K P values of state, whatever N is,
    with K 0, 1 and 2 for SGD, SGD with momentum and Adam."""
    expect_stage(seen, ctx, 0, "ddp_holds_everything_on_every_rank", hint=ddp_hint(seen, ctx))


@check(every_stage, points=2, hint=TABLE_HINT)
def stage_1_shards_the_optimizer_state(seen, ctx):
    """Stage 1: the state falls to K ceil(P / N) values per rank; parameters and gradients
    stay whole."""
    expect_stage(seen, ctx, 1, STAGE_CHECKS[1])


@check(every_stage, points=2, hint=TABLE_HINT)
def stage_2_shards_the_gradients_too(seen, ctx):
    """Stage 2: the gradients fall to ceil(P / N) values per rank as well."""
    expect_stage(seen, ctx, 2, STAGE_CHECKS[2])


@check(every_stage, points=2, hint=TABLE_HINT)
def stage_3_shards_the_parameters_too(seen, ctx):
    """Stage 3: each rank holds ceil(P / N) parameters, gradients and K ceil(P / N) state."""
    expect_stage(seen, ctx, 3, STAGE_CHECKS[3])


@check(
    odd_length,
    points=1,
    hint="When N does not divide P, tensor_split makes the first chunks one value larger: "
    "rank 0 holds ceil(P / N) values, -(-P // N), not P // N.",
)
def rank_0_holds_the_largest_chunk(seen, ctx):
    """With 25 values over 2, 3 and 4 ranks, each sharded stage counts rank 0's ceil(P / N)."""
    for stage in (1, 2, 3):
        expect_stage(seen, ctx, stage, CHUNK_CHECK, kind="odd", hint=None)


@check(
    with_a_frozen_layer,
    points=1,
    hint="Count only the parameters that train (p.requires_grad): a frozen layer has no "
    "gradient and no state, and buffers (batch norm's running statistics) are not parameters.",
)
def counts_only_what_trains(seen, ctx):
    """Beside a frozen layer and batch norm's buffers, only the 54 values that train count."""
    expect_stage(seen, ctx, 0, "counts_only_what_trains", kind="frozen", sizes=(1, 2), hint=None)


@check(
    unknown_stages,
    points=1,
    hint="Raise ValueError for a stage other than 0, 1, 2 and 3, and say which stages exist.",
)
def rejects_a_stage_that_does_not_exist(seen, ctx):
    """Stages 4 and -1 raise ValueError."""
    for stage, outcome in zip((4, -1), seen, strict=True):
        raised = raised_in(outcome)
        expect(
            raised is not None and raised.type == "ValueError",
            _("stage {stage}: {what}").format(
                stage=stage,
                what=_("returned {got}").format(got=outcome.get("returned"))
                if raised is None
                else _("raised {type}, not ValueError").format(type=raised.type),
            ),
        )
