"""Public checks of `try_gpu(i=0)`: GPU `i` when it exists, otherwise the CPU."""

from grader.api import Attempt, _, attempt, case, check_on, expect, pretend_gpus, returned


def expect_devices(calls: list[Attempt], wanted: list[str], setting: str, asked: str) -> None:
    """Fail unless the calls returned these devices, as torch.device objects."""
    got = [returned(c) for c in calls]  # a call that raised fails this check, not the others
    expect(
        [g["device"] for g in got] == wanted,
        _("with {setting}, {asked} gave {got}, expected {wanted}").format(
            setting=setting, asked=asked, got=[g["device"] for g in got], wanted=wanted
        ),
    )
    for g in got:
        expect(
            g["kind"] == "device",
            _("it returned a {kind}, expected a torch.device").format(kind=g["kind"]),
        )


def describe(call: Attempt) -> Attempt:
    """Keep what a call returned as its type and name, so any object can be sent back."""
    if call.raised is None:
        value = call.returned
        call.returned = {"kind": type(value).__name__, "device": str(value)}
    return call


@case
def ask_with_gpus(student, ctx, gpus: int, indices: list[int]):
    """Pretend the machine has `gpus` GPUs; ask for each index, then for the default. Each
    call is recorded on its own, so one that raises costs only the checks that use it."""
    fn = student.fn
    with pretend_gpus(gpus):
        return [describe(attempt(fn, i)) for i in indices] + [describe(attempt(fn))]


four_gpus = ask_with_gpus.using(
    "four_gpus",
    "Pretend there are four GPUs; ask for 0, 3, 4, 7 and the default.",
    gpus=4,
    indices=[0, 3, 4, 7],
)


@check_on(
    four_gpus,
    points=1,
    hint="Return torch.device(f'cuda:{i}') when i < torch.cuda.device_count(); the default is i=0.",
)
def returns_gpu_i_when_it_exists(seen, ctx):
    """With four GPUs, try_gpu(0), try_gpu(3) and try_gpu() give cuda:0, cuda:3 and cuda:0.
    Property: GPU i where it exists; against the reference (the devices named)."""
    picked = [seen[i] for i in (0, 1, 4)]
    expect_devices(
        picked, ["cuda:0", "cuda:3", "cuda:0"], _("4 GPUs"), "try_gpu(0), try_gpu(3), try_gpu()"
    )


@check_on(
    four_gpus,
    points=1,
    hint="GPUs are numbered from 0, so with 4 GPUs there is no cuda:4: "
    "return torch.device('cpu') when i >= torch.cuda.device_count().",
)
def returns_cpu_when_gpu_i_is_missing(seen, ctx):
    """With four GPUs, try_gpu(4) and try_gpu(7) give the CPU.
    Property: the CPU for a GPU that is missing; against the reference (the CPU)."""
    expect_devices(seen[2:4], ["cpu", "cpu"], _("4 GPUs"), "try_gpu(4), try_gpu(7)")
