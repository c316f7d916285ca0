"""Hidden checks of `train_ddp`: another global batch, learning rate and number of epochs."""

from grader.api import _, charged_by, check_on, expect, expect_close
from grader.exercises.train_ddp.checks import (
    DEADLOCK_OWNER,
    expect_the_given_optimizer,
    finished_runs,
    plain_state,
    replay,
    same_weights,
    step_sizes,
    training_run,
    training_steps,
)

LR, BATCH, EPOCHS = 0.2, 48, 3

another_run = training_run.using(
    "another_run",
    "Three epochs with a global batch of 48 and a learning rate of 0.2.",
    num_epochs=EPOCHS,
    batch_size=BATCH,
    lr=LR,
)


@check_on(
    another_run,
    points=2,
    hint="Use num_epochs, batch_size (the global batch, split over the ranks) and lr as given.",
)
def matches_one_process_with_other_settings(seen, ctx):
    """With batch 48, lr 0.2 and 3 epochs, the ranks agree with one process's replay.
    Property: the settings given are used; against the reference (one process replaying the ranks'
    global batches with plain SGD at batch 48, lr 0.2, 3 epochs)."""
    with charged_by(DEADLOCK_OWNER):  # a run that never ends, or collectives that differ
        groups = finished_runs(seen)
    for g in groups:
        steps = training_steps(g.ranks[0]["log"])
        expect(
            len(steps) == EPOCHS * 96 // BATCH,
            _(
                "with {n} processes, rank 0 took {steps} training steps; 3 epochs of 96 "
                "examples in global batches of {batch} take {wanted}"
            ).format(n=g.n, steps=len(steps), batch=BATCH, wanted=EPOCHS * 96 // BATCH),
            # the public checks judge these causes: each rank's share of the global batch, or
            # of the examples
            see="each_rank_trains_on_its_own_shard"
            if step_sizes(g.ranks[0]["log"]) == [BATCH // g.n]
            else "each_rank_takes_its_share_of_the_global_batch",
        )
        agree = all(same_weights(r["final"], g.ranks[0]["final"]) for r in g.ranks.values())
        # ranks that disagree, or a step wrong with the public settings too: charged there
        owner = "matches_one_process_on_the_same_global_batches" if agree else DEADLOCK_OWNER
        with charged_by(owner):
            expect_replayed(g, ctx)


def expect_replayed(g, ctx) -> None:
    """Fail unless every rank stepped as one process replaying the ranks' global batches."""
    for r in g.each_rank():
        expect_the_given_optimizer(r, LR)
    single = replay(list(g.ranks.values()), ctx.seed, LR)
    for r in g.each_rank():
        for name, value in plain_state(r.record["final"]).items():
            expect_close(
                value,
                single[name],
                _("with {n} processes, rank {rank}'s {name}").format(n=r.n, rank=r.rank, name=name),
                rtol=1e-4,
                atol=1e-5,
            )
