"""Hidden checks of `try_all_gpus`."""

from grader.api import case, check
from grader.checks.try_all_gpus import expect_listing, listing
from grader.fixtures import pretend_gpus


@case
def one_gpu(student, ctx):
    """Pretend there is exactly one GPU and list the devices."""
    with pretend_gpus(1):
        return listing(student)


@check(one_gpu, points=1, hint="With one GPU the list is [cuda:0], without the CPU.")
def lists_the_single_gpu(seen, ctx):
    """With one GPU it returns [cuda:0]."""
    expect_listing(seen, ["cuda:0"], "1 GPU")
