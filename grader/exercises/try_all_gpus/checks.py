"""Public checks of `try_all_gpus()`: every GPU, or `[cpu]` when there is none."""

from grader.api import _, case, check_on, expect, pretend_gpus


def listing(student) -> dict:
    """Call try_all_gpus and note what came back."""
    got = student.fn()
    items = list(got) if isinstance(got, list | tuple) else None
    return {
        "kind": type(got).__name__,
        "devices": [str(d) for d in items] if items is not None else None,
        "kinds": [type(d).__name__ for d in items] if items is not None else [],
    }


def expect_listing(seen: dict, wanted: list[str], setting: str) -> None:
    """Fail unless try_all_gpus gave a list of exactly these devices."""
    expect(
        seen["devices"] is not None,
        _("it returned a {kind}, expected a list of devices").format(kind=seen["kind"]),
    )
    expect(
        seen["devices"] == wanted,
        _("with {setting} it gave {got}, expected {wanted}").format(
            setting=setting, got=seen["devices"], wanted=wanted
        ),
    )
    for kind in seen["kinds"]:
        expect(
            kind == "device",
            _("the list holds a {kind}, expected torch.device objects").format(kind=kind),
        )


@case
def listing_with_gpus(student, ctx, gpus: int):
    """Pretend the machine has `gpus` GPUs and list the devices."""
    with pretend_gpus(gpus):
        return listing(student)


three_gpus = listing_with_gpus.using("three_gpus", "Pretend there are three GPUs.", gpus=3)
no_gpu = listing_with_gpus.using("no_gpu", "Pretend there is no GPU.", gpus=0)


@check_on(
    three_gpus,
    points=1,
    hint="Build [torch.device(f'cuda:{i}') for i in range(torch.cuda.device_count())].",
)
def lists_every_gpu(seen, ctx):
    """With three GPUs it lists cuda:0, cuda:1 and cuda:2, in order.
    Property: every GPU, in order; against the reference (the list named)."""
    expect_listing(seen, ["cuda:0", "cuda:1", "cuda:2"], _("3 GPUs"))


@check_on(
    no_gpu,
    points=1,
    hint="With no GPU the list would be empty and training code would have no device: "
    "return [torch.device('cpu')] then.",
)
def gives_the_cpu_when_there_is_no_gpu(seen, ctx):
    """With no GPU it returns [cpu], not an empty list.
    Property: [cpu] without GPUs; against the reference (the list named)."""
    expect_listing(seen, ["cpu"], _("no GPU"))
