"""Hidden checks of `try_gpu`."""

from grader.api import Fail, _, check_on
from grader.exercises.try_gpu.checks import ask_with_gpus, expect_devices

no_gpu = ask_with_gpus.using("no_gpu", "Pretend there is no GPU at all.", gpus=0, indices=[0, 1])


@check_on(no_gpu, points=1, hint="On a machine without GPUs every index gives torch.device('cpu').")
def returns_cpu_on_a_machine_without_gpus(seen, ctx):
    """Without GPUs, try_gpu(0), try_gpu(1) and try_gpu() give the CPU.
    Property: the CPU on a machine without GPUs; against the reference (the CPU)."""
    # The property of returns_cpu_when_gpu_i_is_missing on a machine with none: it charges
    # only where that check passed.
    try:
        expect_devices(
            seen, ["cpu", "cpu", "cpu"], _("no GPU"), "try_gpu(0), try_gpu(1), try_gpu()"
        )
    except Fail as fail:  # the slip: a GPU given that is not there
        if any((c.returned or {}).get("device", "").startswith("cuda") for c in seen):
            fail.see = "returns_cpu_when_gpu_i_is_missing"
        raise
