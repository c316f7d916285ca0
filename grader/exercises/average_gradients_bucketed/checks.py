"""Public checks of `average_gradients_bucketed(model, bucket_mb=25)`: the same averages as
`average_gradients`, with one all_reduce per bucket of flattened gradients.

The cases are those of `average_gradients` (grader.exercises.average_gradients.checks),
called with a bucket size: the default, which holds the checks' whole network in one bucket,
and one of about 4 KiB, which cuts it into three. The checks compare the gradients with one
process on the whole batch, count the all_reduce calls, and read what each bucket held.
"""

from grader.api import N_, Fail, _, charged_by, check_on, expect, groups_finished
from grader.exercises.average_gradients.checks import (
    UNCHANGED_HINT,
    expect_mean_gradients,
    grad_model,
    gradients_of_a_shard,
    plain,
)

MEAN = "gradients_are_the_mean_over_ranks"  # the means against the reference
SMALL_MEAN = "gradients_are_the_mean_with_small_buckets"
SMALL_MB = 0.004  # 4,194 bytes: the checks' network falls into three buckets
BUCKET_HINT = N_(
    "Walk the parameters in reverse order, adding each gradient to the current bucket until "
    "the next one would take it past bucket_mb * 2**20 bytes; then torch.cat the bucket's "
    "flattened gradients, all_reduce that one tensor, divide it, and copy each slice back "
    "into its gradient (grad.copy_(flat[offset:offset + n].view_as(grad)))."
)


def expected_buckets(frozen: bool, bucket_mb: float) -> list[list[int]]:
    """Return the parameter numbers in each bucket, filled greedily in reverse order."""
    limit = bucket_mb * 2**20
    params = list(grad_model(0, frozen).parameters())
    buckets: list[list[int]] = []
    size = 0.0
    for i in reversed(range(len(params))):
        if not params[i].requires_grad:
            continue
        nbytes = params[i].numel() * params[i].element_size()
        if not buckets or size + nbytes > limit:
            buckets.append([])
            size = 0.0
        buckets[-1].append(i)
        size += nbytes
    return buckets


default_buckets = gradients_of_a_shard.using(
    "default_buckets",
    "The shard's gradients, averaged with the default bucket_mb=25.",
    arguments={},
)
small_buckets = gradients_of_a_shard.using(
    "small_buckets",
    "The shard's gradients, averaged with bucket_mb=0.004 (three buckets).",
    arguments={"bucket_mb": SMALL_MB},
)
small_buckets_frozen = gradients_of_a_shard.using(
    "small_buckets_frozen",
    "The same with the first layer frozen (its parameters have no gradient).",
    frozen=True,
    arguments={"bucket_mb": SMALL_MB},
)


def reduced(result: dict) -> list[dict]:
    return [c for c in result["calls"] if c["name"] == "all_reduce"]


def expect_mean_with_buckets(seen, ctx, frozen: bool = False) -> None:
    """As expect_mean_gradients, naming gradients that their bucket never reached again."""
    try:
        expect_mean_gradients(seen, ctx, frozen)
    except Fail as fail:
        if fail.hint in (None, UNCHANGED_HINT):
            for n, ranks in groups_finished(seen):
                for rank, result in enumerate(ranks):
                    pairs = zip(result["grads"], result["local"], strict=False)
                    stale = [
                        i
                        for i, (g, m) in enumerate(pairs)
                        if m is not None and g is not None and plain(g).equal(plain(m))
                    ]
                    if stale:
                        fail.message = _(
                            "{message} (with {n} processes, rank {rank}: the gradients of "
                            "parameters {stale} still hold the rank's own values)"
                        ).format(message=fail.message, n=n, rank=rank, stale=stale)
                        fail.hint = _(
                            "Some gradients never got their bucket's average back: after each "
                            "bucket's all_reduce, copy every slice back into its gradient."
                        )
                        raise fail
        raise


@check_on(default_buckets, points=3, hint=BUCKET_HINT)
def gradients_are_the_mean_over_ranks(seen, ctx):
    """With the default buckets, every rank ends with one process's whole-batch gradients.
    Property: the mean gradients; against the reference (one process's gradients on the whole
    batch)."""
    expect_mean_with_buckets(seen, ctx)


@check_on(small_buckets, points=2, hint=BUCKET_HINT)
def gradients_are_the_mean_with_small_buckets(seen, ctx):
    """With buckets of about 4 KiB (three of them), the gradients are the same means.
    Property: the mean gradients over several buckets; against the reference (one process's
    gradients on the whole batch)."""
    with charged_by(MEAN):  # wrong with one bucket too: charged there
        expect_mean_with_buckets(seen, ctx)


@check_on(
    small_buckets,
    points=2,
    hint="Make one all_reduce per bucket, of the bucket's gradients flattened into one tensor "
    "(torch.cat), not one per parameter.",
)
def one_all_reduce_per_bucket(seen, ctx):
    """As many all_reduce calls as there are buckets: 1 by default, 3 with small buckets.
    Property: one all_reduce per bucket; against the reference (the three buckets that
    bucket_mb=0.004 makes, counted in the recorded calls)."""
    expect_one_call_per_bucket(seen)


def over_the_limit(result: dict) -> bool:
    """Return True when a rank reduced a bucket over the small limit."""
    return any(call.get("nbytes", 0) > SMALL_MB * 2**20 for call in reduced(result))


def expect_one_call_per_bucket(seen: list[dict]) -> None:
    """Fail unless every rank made one all_reduce per small bucket."""
    wanted = len(expected_buckets(False, SMALL_MB))
    with charged_by(SMALL_MEAN):
        groups = groups_finished(seen)
    for n, ranks in groups:
        for rank, result in enumerate(ranks):
            count = len(reduced(result))
            expect(
                count == wanted,
                _(
                    "with {n} processes and bucket_mb={bucket_mb}, rank {rank} called all_reduce "
                    "{count} times; the {gradients} gradients fill {wanted} buckets"
                ).format(
                    n=n,
                    bucket_mb=SMALL_MB,
                    rank=rank,
                    count=count,
                    gradients=len(result["grads"]),
                    wanted=wanted,
                ),
                None
                if count > wanted
                else _(
                    "The buckets hold too much: a bucket is full at bucket_mb * 2**20 bytes "
                    "(a gradient takes numel() * element_size() bytes)."
                ),
                # too few calls: buckets too big, or one left out (its gradients unaveraged)
                see="no_bucket_over_the_limit"
                if over_the_limit(result)
                else (None if count > wanted else SMALL_MEAN),
            )


@check_on(
    default_buckets,
    points=1,
    hint="With the default bucket_mb=25, the checks' whole network (under 10 KiB of "
    "gradients) fits in one bucket: one all_reduce in all.",
)
def one_all_reduce_with_the_default_size(seen, ctx):
    """bucket_mb defaults to 25 MiB, which holds the whole small network: one call.
    Property: the default bucket size; against the reference (one call: 25 MiB holds the whole
    network)."""
    with charged_by(MEAN):
        groups = groups_finished(seen)
    for n, ranks in groups:
        for rank, result in enumerate(ranks):
            count = len(reduced(result))
            expect(
                count == 1,
                _("with {n} processes, rank {rank} called all_reduce {count} times").format(
                    n=n, rank=rank, count=count
                ),
                # more calls: one_all_reduce_per_bucket judges them; none: the means show it
                see="one_all_reduce_per_bucket" if count > 1 else MEAN,
            )


@check_on(
    small_buckets,
    points=1,
    hint="Start a new bucket when the next gradient would take the current one past "
    "bucket_mb * 2**20 bytes (numel() * element_size()); a gradient bigger than that on its "
    "own gets a bucket of its own.",
)
def no_bucket_over_the_limit(seen, ctx):
    """No all_reduce carries more than bucket_mb MiB, unless it holds a single gradient.
    Property: no bucket over the limit; against the reference (bucket_mb * 2**20 bytes, read from
    each recorded call)."""
    limit = SMALL_MB * 2**20
    sizes = {p.numel() for p in grad_model(0).parameters()}
    with charged_by(SMALL_MEAN):
        groups = groups_finished(seen)
    for n, ranks in groups:
        for rank, result in enumerate(ranks):
            for call in reduced(result):
                held = call.get("of", ["other"])
                alone = held != ["other"] and len(held) == 1
                if held == ["other"]:  # not recognised: one gradient's size at most
                    alone = call.get("numel", 0) in sizes
                expect(
                    call.get("nbytes", 0) <= limit or alone,
                    _(
                        "with {n} processes, rank {rank} reduced a bucket of {nbytes} bytes "
                        "({held}); the limit is {limit:.0f} bytes"
                    ).format(
                        n=n,
                        rank=rank,
                        nbytes=call.get("nbytes", 0),
                        held=", ".join(held),
                        limit=limit,
                    ),
                )


@check_on(
    small_buckets,
    points=1,
    hint="Fill the buckets from the last parameter backwards (reversed(list(model."
    "parameters()))): backward() finishes the last layers' gradients first, so DDP reduces "
    "them first, while the first layers are still being computed.",
)
def buckets_start_from_the_last_parameter(seen, ctx):
    """The first bucket holds the last parameter's gradient, as DDP's do.
    Property: the buckets' order; against the reference (the last parameter's gradient in the first
    recorded call)."""
    last = f"grad {len(list(grad_model(0).parameters())) - 1}"
    with charged_by(SMALL_MEAN):
        groups = groups_finished(seen)
    for n, ranks in groups:
        for rank, result in enumerate(ranks):
            calls = reduced(result)
            first = calls[0].get("of", []) if calls else []
            expect(
                last in first,
                _("with {n} processes, rank {rank}'s first bucket held {first}, not {last}").format(
                    n=n, rank=rank, first=first, last=last
                ),
                see=None if first else SMALL_MEAN,  # no call at all: nothing was averaged
            )


@check_on(
    small_buckets_frozen,
    points=1,
    hint="A frozen parameter has no gradient (None): leave it out of the buckets.",
)
def skips_frozen_parameters(seen, ctx):
    """With the first layer frozen, its gradients stay None and the others are averaged.
    Property: frozen parameters are left out; against the reference (None for the frozen layer, one
    process's whole-batch gradients for the others)."""
    with charged_by(SMALL_MEAN):  # wrong without a frozen layer too: charged there
        expect_mean_with_buckets(seen, ctx, frozen=True)
    for n, ranks in groups_finished(seen):
        for rank, result in enumerate(ranks):
            expect(
                result["grads"][0] is None and result["grads"][1] is None,
                _("with {n} processes, rank {rank}: a frozen parameter has a gradient now").format(
                    n=n, rank=rank
                ),
            )
