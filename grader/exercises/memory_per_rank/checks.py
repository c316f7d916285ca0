"""Public checks of `memory_per_rank(model, optimizer, stage, world_size)`: the bytes of
parameters, gradients and optimizer state that rank 0 holds, for DDP (stage 0) and ZeRO's
stages 1, 2 and 3.

The case builds small networks and optimizers that have taken one step, and asks the
student's function for every stage in groups of 1 to 4 ranks. The checks compare each answer
with the table of the notebook: P values that train, K values of state per value, and chunks
of ceil(P / N) values, times the bytes per value.
"""

from collections import Counter
from fractions import Fraction
from typing import NamedTuple

import torch
from torch import nn

from grader.api import N_, Attempt, _, attempt, case, check_on, expect, finished, raised_in

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


@case
def two_lengths(student, ctx):
    """Adam on a network of 132 values that train (2, 3 and 4 divide it) and on one of 25
    (none does), every stage in groups of 1 to 4."""
    return {kind: every_stage.run(student, ctx, kind=kind, optimizers=("Adam",)) for kind in KINDS}


KINDS = ("even", "odd")
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


def answer_of(outcome: Attempt):
    """Return what a call returned, or None where it raised or returned something else than a
    number."""
    if raised_in(outcome) is not None:
        return None
    got = outcome.returned
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
DDP_CHECK = "ddp_holds_everything_on_every_rank"


def stage_bytes(t: Table, stage: int, chunk: Fraction) -> Fraction:
    """Return the table's figure for `stage` with chunks of `chunk` values (the student's own
    chunk, in the relations)."""
    held = (
        chunk if stage >= 3 else t.total,
        chunk if stage >= 2 else t.total,
        t.per_value * (chunk if stage >= 1 else t.total),
    )
    return sum(held) * t.size


def chunk_of(got, t: Table, stage: int) -> Fraction | None:
    """Return the chunk size that a sharded stage's figure implies, with the table's P, K and
    bytes (None for stage 1 without state, which holds no chunk)."""
    values = Fraction(got).limit_denominator(10_000) / t.size
    if stage == 1:
        return (values - 2 * t.total) / t.per_value if t.per_value else None
    if stage == 2:
        return (values - t.total) / (1 + t.per_value)
    return values / (2 + t.per_value)


def own_chunk(seen, kind: str, dtype, world: int) -> Fraction | None:
    """Return the student's own chunk size over `world` ranks: the one that most of its
    sharded figures imply (every optimizer, stages 1 to 3), or None where none does. One
    stage counted wrong leaves the others' agreement; a chunk wrong everywhere moves them all
    together."""
    votes: Counter = Counter()
    for entry in seen:
        t = table(kind, entry["optimizer"], dtype)
        for stage in (1, 2, 3):
            got = answer_of(entry["answers"][key(stage, world)])
            chunk = None if got is None else chunk_of(got, t, stage)
            if chunk is not None and chunk > 0:
                votes[chunk] += 1
    ranked = votes.most_common(2)
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


def ddp_right_in(seen, kind: str, dtype, sizes) -> bool:
    """Return True when every DDP figure of the case matches the table."""
    return all(
        right(entry["answers"][key(0, n)], table(kind, entry["optimizer"], dtype), 0, n)
        for entry in seen
        for n in sizes
    )


def wrong_figure(stage: int, name: str, world: int, outcome: Attempt, t, chunk) -> str:
    """What a stage's wrong figure is against the table (a sharded stage's with `chunk`)."""
    said = {"stage": _(STAGE_NAMES[stage]), "optimizer": _(name), "n": world,
            "got": outcome.returned}  # fmt: skip
    if not stage:
        return _(
            "{stage} with {optimizer} over {n} ranks: returned {got}, expected {want} bytes"
        ).format(**said, want=expected_bytes(t, stage, world))
    return _(
        "{stage} with {optimizer} over {n} ranks: returned {got}, expected {want} "
        "bytes (with chunks of {chunk} values, as your other stages count them)"
    ).format(**said, want=chunk_text(stage_bytes(t, stage, chunk)), chunk=chunk_text(chunk))


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
    """Fail unless every answer for `stage` matches the table: DDP's against the reference,
    a sharded stage's through a relation, against the table with the student's own chunk
    (`own_chunk`, the reference's where its figures imply none), so that a wrong chunk is
    the chunk check's alone. A wrong sharded figure where the DDP figures are wrong too is
    the DDP check's, and one that another check than the stage's own (`me`, the check that
    asks) sees is the stage check's where it fails too."""
    calls = [o["answers"][key(stage, n)] for o in seen for n in sizes]
    finished(calls)  # every call raised: the check cannot judge
    own = STAGE_CHECKS.get(stage, DDP_CHECK)
    if stage and me != DDP_CHECK and not ddp_right_in(seen, kind, dtype, sizes):
        see = DDP_CHECK  # P, K or the bytes are counted wrong, which every stage shows
    else:
        see = None if own == me else own  # the check of this stage, where another asks
    for world in sizes:
        chunk = own_chunk(seen, kind, dtype, world) if stage else None
        for entry in seen:
            name = entry["optimizer"]
            t = table(kind, name, dtype)
            outcome = entry["answers"][key(stage, world)]
            if raised_in(outcome) is not None:
                continue
            mine = chunk if chunk is not None else Fraction(-(-t.total // world))
            got = answer_of(outcome)
            if got is not None and Fraction(got).limit_denominator(10_000) == stage_bytes(
                t, stage, mine
            ):
                continue
            expect(False, wrong_figure(stage, name, world, outcome, t, mine), hint, see=see)


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


@check_on(every_stage, points=2, hint=TABLE_HINT)
def ddp_holds_everything_on_every_rank(seen, ctx):
    """DDP: each rank holds P parameters, P gradients and K P values of state, whatever N is,
    with K 0, 1 and 2 for SGD, SGD with momentum and Adam.
    Property: P, K and the bytes; against the reference (the notebook's table), the one check
    that compares the DDP figure."""
    expect_stage(seen, ctx, 0, "ddp_holds_everything_on_every_rank", hint=ddp_hint(seen, ctx))


@check_on(every_stage, points=2, hint=TABLE_HINT)
def stage_1_shards_the_optimizer_state(seen, ctx):
    """Stage 1: the state falls to K ceil(P / N) values per rank; parameters and gradients stay
    whole.
    Property: stage 1 shards the state alone; a relation: the table's figure with the code's own
    chunk (own_chunk), so a wrong chunk is rank_0_holds_the_largest_chunk's alone."""
    expect_stage(seen, ctx, 1, STAGE_CHECKS[1])


@check_on(every_stage, points=2, hint=TABLE_HINT)
def stage_2_shards_the_gradients_too(seen, ctx):
    """Stage 2: the gradients fall to ceil(P / N) values per rank as well.
    Property: stage 2 shards the gradients too; a relation: the table's figure with the code's
    own chunk (own_chunk)."""
    expect_stage(seen, ctx, 2, STAGE_CHECKS[2])


@check_on(every_stage, points=2, hint=TABLE_HINT)
def stage_3_shards_the_parameters_too(seen, ctx):
    """Stage 3: each rank holds ceil(P / N) parameters, gradients and K ceil(P / N) state.
    Property: stage 3 shards the parameters too; a relation: the table's figure with the code's
    own chunk (own_chunk)."""
    expect_stage(seen, ctx, 3, STAGE_CHECKS[3])


@check_on(
    two_lengths,
    points=1,
    hint="Rank 0's chunk is ceil(P / N) values, -(-P // N): the chunks of tensor_split(N), "
    "whose first ones are one value larger when N does not divide P (not P // N, P / N or "
    "P // N + 1).",
)
def rank_0_holds_the_largest_chunk(seen, ctx):
    """With Adam over 1 to 4 ranks, on 132 values and on 25, the sharded stages count rank 0's
    chunk as ceil(P / N) values.
    Property: the chunk size; against the reference (ceil(P / N)), the one check that compares
    the chunk: the chunk that most of the code's sharded figures imply (own_chunk), on a length
    every N divides and one none does; where the DDP figures are wrong too, the DDP check
    charges."""
    for kind in KINDS:
        entries = seen[kind]
        finished([o["answers"][key(s, n)] for o in entries for s in (1, 2, 3) for n in SIZES])
        see = None if ddp_right_in(entries, kind, torch.float32, SIZES) else DDP_CHECK
        total = table(kind, "Adam").total
        for world in SIZES:
            chunk = own_chunk(entries, kind, torch.float32, world)
            want = -(-total // world)
            expect(
                chunk == want,
                _(
                    "with {total} values that train over {n} ranks, your sharded stages count "
                    "chunks of {chunk} values; rank 0's chunk is ceil(P / N) = {want}"
                ).format(
                    total=total,
                    n=world,
                    chunk=_("no one size") if chunk is None else chunk_text(chunk),
                    want=want,
                ),
                see=see,
            )


def chunk_text(chunk: Fraction) -> str:
    """Return a chunk size as a student would write it: 13, or 8.333 for a fraction."""
    return str(chunk.numerator) if chunk.denominator == 1 else f"{float(chunk):.4g}"


@check_on(
    with_a_frozen_layer,
    points=1,
    hint="Count only the parameters that train (p.requires_grad): a frozen layer has no "
    "gradient and no state, and buffers (batch norm's running statistics) are not parameters.",
)
def counts_only_what_trains(seen, ctx):
    """Beside a frozen layer and batch norm's buffers, only the 54 values that train count.
    Property: only what trains counts; against the reference (the DDP figure of the 54 values
    that train), a DDP figure wrong without a frozen layer too being the DDP check's."""
    expect_stage(seen, ctx, 0, "counts_only_what_trains", kind="frozen", sizes=(1, 2), hint=None)


@check_on(
    unknown_stages,
    points=1,
    hint="Raise ValueError for a stage other than 0, 1, 2 and 3, and say which stages exist.",
)
def rejects_a_stage_that_does_not_exist(seen, ctx):
    """Stages 4 and -1 raise ValueError.
    Property: unknown stages are refused; against the reference (ValueError, as the exercise
    states)."""
    for stage, outcome in zip((4, -1), seen, strict=True):
        raised = raised_in(outcome)
        expect(
            raised is not None and raised.type == "ValueError",
            _("stage {stage}: {what}").format(
                stage=stage,
                what=_("returned {got}").format(got=outcome.returned)
                if raised is None
                else _("raised {type}, not ValueError").format(type=raised.type),
            ),
        )
