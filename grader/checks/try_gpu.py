"""Public checks of `try_gpu(i=0)`: GPU `i` when it exists, otherwise the CPU."""

from grader.api import case, check, expect
from grader.fixtures import pretend_gpus


def expect_devices(seen: dict, wanted: list[str], setting: str, asked: str) -> None:
    """Fail unless the devices and their types are as wanted."""
    expect(
        seen["devices"] == wanted,
        f"with {setting}, {asked} gave {seen['devices']}, expected {wanted}",
    )
    for kind in seen["kinds"]:
        expect(kind == "device", f"it returned a {kind}, expected a torch.device")


@case
def ask_with_gpus(student, ctx, gpus: int, indices: list[int]):
    """Pretend the machine has `gpus` GPUs; ask for each index, then for the default."""
    with pretend_gpus(gpus):
        got = [student.fn(i) for i in indices] + [student.fn()]
    return {"kinds": [type(d).__name__ for d in got], "devices": [str(d) for d in got]}


four_gpus = ask_with_gpus.using(
    "four_gpus",
    "Pretend there are four GPUs; ask for 0, 3, 4, 7 and the default.",
    gpus=4,
    indices=[0, 3, 4, 7],
)


@check(
    four_gpus,
    points=1,
    hint="Return torch.device(f'cuda:{i}') when i < torch.cuda.device_count(); the default is i=0.",
)
def returns_gpu_i_when_it_exists(seen, ctx):
    """With four GPUs, try_gpu(0), try_gpu(3) and try_gpu() give cuda:0, cuda:3 and cuda:0."""
    picked = {"devices": [seen["devices"][i] for i in (0, 1, 4)], "kinds": seen["kinds"]}
    expect_devices(
        picked, ["cuda:0", "cuda:3", "cuda:0"], "4 GPUs", "try_gpu(0), try_gpu(3), try_gpu()"
    )


@check(
    four_gpus,
    points=1,
    hint="GPUs are numbered from 0, so with 4 GPUs there is no cuda:4: "
    "return torch.device('cpu') when i >= torch.cuda.device_count().",
)
def returns_cpu_when_gpu_i_is_missing(seen, ctx):
    """With four GPUs, try_gpu(4) and try_gpu(7) give the CPU."""
    picked = {"devices": seen["devices"][2:4], "kinds": seen["kinds"]}
    expect_devices(picked, ["cpu", "cpu"], "4 GPUs", "try_gpu(4), try_gpu(7)")
