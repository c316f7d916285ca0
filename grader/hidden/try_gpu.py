"""Hidden checks of `try_gpu`."""

from grader.api import case, check
from grader.checks.try_gpu import ask, expect_devices
from grader.fixtures import pretend_gpus


@case
def no_gpu(student, ctx):
    """Pretend there is no GPU at all; ask for GPUs 0 and 1, then for the default."""
    with pretend_gpus(0):
        return ask(student, [0, 1])


@check(no_gpu, points=1, hint="On a machine without GPUs every index gives torch.device('cpu').")
def returns_cpu_on_a_machine_without_gpus(seen, ctx):
    """Without GPUs, try_gpu(0), try_gpu(1) and try_gpu() give the CPU."""
    expect_devices(seen, ["cpu", "cpu", "cpu"], "no GPU", "try_gpu(0), try_gpu(1), try_gpu()")
