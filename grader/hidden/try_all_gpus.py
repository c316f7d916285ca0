"""Hidden checks of `try_all_gpus`."""

from grader.api import _, check
from grader.checks.try_all_gpus import expect_listing, listing_with_gpus

one_gpu = listing_with_gpus.using("one_gpu", "Pretend there is exactly one GPU.", gpus=1)


@check(one_gpu, points=1, hint="With one GPU the list is [cuda:0], without the CPU.")
def lists_the_single_gpu(seen, ctx):
    """With one GPU it returns [cuda:0]."""
    expect_listing(seen, ["cuda:0"], _("1 GPU"))
