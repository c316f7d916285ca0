"""Hidden checks of `try_all_gpus`."""

from grader.api import Fail, _, check_on
from grader.exercises.try_all_gpus.checks import expect_listing, listing_with_gpus

one_gpu = listing_with_gpus.using("one_gpu", "Pretend there is exactly one GPU.", gpus=1)


@check_on(one_gpu, points=1, hint="With one GPU the list is [cuda:0], without the CPU.")
def lists_the_single_gpu(seen, ctx):
    """With one GPU it returns [cuda:0].
    Property: a single GPU is listed; against the reference (the list named)."""
    # The property of lists_every_gpu with a single GPU: it charges only where that passed.
    try:
        expect_listing(seen, ["cuda:0"], _("1 GPU"))
    except Fail as fail:  # the slip: a list of GPUs, but not the ones there are
        if seen["devices"] and all(d.startswith("cuda") for d in seen["devices"]):
            fail.see = "lists_every_gpu"
        raise
