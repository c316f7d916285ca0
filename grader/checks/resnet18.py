"""Public checks of `resnet18(num_classes, in_channels=1)`: the book's ResNet-18 for 28x28.

The stem has a check of its own, and every other check leaves it aside, so that the
ImageNet stem (7x7 convolution and max-pooling, from the book's ResNet chapter) costs only
that check. Either edition's `d2l.Residual` works; d2l 1.0's learns its input channels at
the first forward pass, so each case runs the network once before looking at its layers.
"""

import torch
from torch import nn

from grader.api import Fail, _, attempt, case, check, error_hints, expect, returned, seeded

PARAMETERS = 11_175_818  # in all, for 10 classes
STEM_PARAMETERS = 64 * 1 * 3 * 3 + 64 + 2 * 64  # the 3x3 convolution and its batch norm
STAGES = ["resnet_block1", "resnet_block2", "resnet_block3", "resnet_block4"]
NAMED = [*STAGES, "global_avg_pool", "fc"]


def count(module: nn.Module) -> int | None:
    """Return the number of parameters, or None while some are not yet made (lazy layers)."""
    try:
        return sum(p.numel() for p in module.parameters())
    except ValueError:  # an uninitialized parameter of a lazy layer
        return None


def stem_length(net: nn.Module) -> int:
    """Return how many top-level modules make the stem: the single layers before the first
    stage (a module made of others) or the first of the book's named parts."""
    length = 0
    for name, m in net.named_children():
        if name in NAMED or next(m.children(), None) is not None:
            break
        length += 1
    return length


def describe(net: nn.Module) -> dict:
    """Note the network's size, top-level names, stem and residual shortcuts."""
    children = list(net.named_children())
    stem = []
    for _name, m in children[: stem_length(net)]:
        entry = {"type": type(m).__name__}
        if isinstance(m, nn.Conv2d):
            entry.update(
                kernel=list(m.kernel_size),
                stride=list(m.stride),
                padding=list(m.padding),
                channels=[m.in_channels, m.out_channels],
            )
        stem.append(entry)
    stages = {}
    for name, m in children:
        if name.startswith("resnet_block"):
            stages[name] = [
                {
                    "shortcut": getattr(r, "conv3", None) is not None,
                    "shortcut_kernel": list(r.conv3.kernel_size)
                    if getattr(r, "conv3", None) is not None
                    else None,
                    "stride": list(r.conv1.stride) if hasattr(r, "conv1") else None,
                }
                for r in m.children()
            ]
    return {
        "parameters": count(net),
        "after_the_stem": sum(count(m) or 0 for _name, m in children[stem_length(net) :]),
        "names": [name for name, _ in children],
        "stem": stem,
        "max_pools": sum(isinstance(m, nn.MaxPool2d) for m in net.modules()),
        "stages": stages,
    }


def output_shape(net: nn.Module, shape: tuple[int, ...], gen: torch.Generator) -> list[int]:
    """Run the network in eval mode on a random batch and return the output's shape."""
    net.eval()
    with torch.no_grad():
        return list(net(torch.randn(shape, generator=gen)).shape)


@case
def ten_classes_one_channel(student, ctx):
    """resnet18(10): its output for two 28x28 images, then its layout."""
    net = student.fn(10)
    out = attempt(output_shape, net, (2, 1, 28, 28), seeded(ctx.seed))
    return {**out, "layout": describe(net)}


@case
def seven_classes_three_channels(student, ctx):
    """resnet18(7, in_channels=3) on two 96x96 colour images."""
    net = student.fn(7, in_channels=3)
    return output_shape(net, (2, 3, 96, 96), seeded(ctx.seed))


def layers(net: nn.Module) -> list[list]:
    """Return [type, parameter shapes] for every module after the stem, in order."""
    return [
        [type(m).__name__, [list(p.shape) for p in m.parameters(recurse=False)]]
        for _name, top in list(net.named_children())[stem_length(net) :]
        for m in top.modules()
    ]


@case
def layer_tree(student, ctx):
    """Every module of resnet18(10) after the stem, with its parameter shapes, once the
    network has run on two 28x28 images."""
    net = student.fn(10)
    output_shape(net, (2, 1, 28, 28), seeded(ctx.seed))
    return layers(net)


@check(
    ten_classes_one_channel,
    points=2,
    hint="Follow the book: four stages of two residual blocks with 64, 128, 256 and 512 "
    "channels, then a 512-to-num_classes linear layer.",
)
def stages_and_classifier_have_the_books_parameter_count(seen, ctx):
    """After the stem (which has its own check), resnet18(10) has 11,175,050 parameters:
    with the book's 3x3 stem, 11,175,818 in all."""
    got = seen["layout"]["after_the_stem"]
    wanted = PARAMETERS - STEM_PARAMETERS
    expect(
        got == wanted,
        _(
            "its stages, pooling and classifier have {got} parameters, expected {wanted} "
            "({total} with the stem)"
        ).format(got=f"{got:,}", wanted=f"{wanted:,}", total=f"{PARAMETERS:,}"),
    )


@check(
    ten_classes_one_channel,
    points=1,
    hint="After the stem, add_module('resnet_block1', ...) up to 'resnet_block4', then "
    "'global_avg_pool' and 'fc'.",
)
def names_its_stages_like_the_book(seen, ctx):
    """After the stem come resnet_block1..4, global_avg_pool and fc, in that order."""
    names = seen["layout"]["names"]
    expect(
        [n for n in names if n in NAMED] == NAMED,
        _("its top-level modules are {names}; expected the stem, then {named}").format(
            names=names, named=NAMED
        ),
    )


@check(
    ten_classes_one_channel,
    points=1,
    hint="For 28x28 images the book uses Conv2d(in_channels, 64, kernel_size=3, stride=1, "
    "padding=1), BatchNorm2d(64) and ReLU, and no max-pooling.",
)
def stem_is_3x3_stride_1_without_max_pooling(seen, ctx):
    """The stem is a 3x3 stride-1 convolution to 64 channels, batch norm and ReLU; no max-pool."""
    stem = seen["layout"]["stem"]
    types = [s["type"] for s in stem]
    if stem and stem[0].get("kernel") == [7, 7] and "MaxPool2d" in types:
        raise Fail(
            _(
                "the stem is the ImageNet one: a 7x7 convolution of stride 2 and a max-pooling "
                "layer, which shrink a 28x28 image to 7x7 before the first stage"
            ),
            _(
                "That stem is from the book's ResNet chapter, for 224x224 images; for 28x28 "
                "Fashion-MNIST the book uses Conv2d(in_channels, 64, kernel_size=3, stride=1, "
                "padding=1), BatchNorm2d(64) and ReLU, and no max-pooling."
            ),
        )
    expect(
        types == ["Conv2d", "BatchNorm2d", "ReLU"],
        _("the stem is {types}, expected ['Conv2d', 'BatchNorm2d', 'ReLU']").format(types=types),
    )
    conv = stem[0]
    got = (conv["kernel"], conv["stride"], conv["padding"], conv["channels"])
    expect(
        got == ([3, 3], [1, 1], [1, 1], [1, 64]),
        _(
            "the first convolution has kernel {kernel}, stride {stride}, padding "
            "{padding} and channels {channels}; expected 3x3, stride 1, padding 1, "
            "1 to 64"
        ).format(
            kernel=conv["kernel"],
            stride=conv["stride"],
            padding=conv["padding"],
            channels=conv["channels"],
        ),
    )
    expect(
        seen["layout"]["max_pools"] == 0,
        _("it has {count} max-pooling layer(s), expected none").format(
            count=seen["layout"]["max_pools"]
        ),
    )


@check(
    ten_classes_one_channel,
    points=1,
    hint="Only the first block of stages 2 to 4 changes shape: give it use_1x1conv=True and "
    "strides=2; every other block keeps the identity shortcut.",
)
def shortcuts_only_where_the_shape_changes(seen, ctx):
    """Stages 2-4 open with a strided block with a 1x1 shortcut; no other block has one."""
    stages = seen["layout"]["stages"]
    for number in range(1, 5):
        blocks = stages.get(f"resnet_block{number}", [])
        expect(
            len(blocks) == 2,
            _("resnet_block{number} has {count} blocks, expected 2").format(
                number=number, count=len(blocks)
            ),
        )
        first, second = blocks
        if number == 1:
            expect(
                not first["shortcut"] and first["stride"] == [1, 1],
                _(
                    "the first block of resnet_block1 changes shape; the first stage keeps 64 "
                    "channels and the full resolution"
                ),
            )
        else:
            expect(
                first["shortcut"]
                and first["shortcut_kernel"] == [1, 1]
                and first["stride"] == [2, 2],
                _(
                    "the first block of resnet_block{number} needs a 1x1 shortcut and stride 2"
                ).format(number=number),
            )
        expect(
            not second["shortcut"],
            _(
                "the second block of resnet_block{number} has a 1x1 shortcut, expected the identity"
            ).format(number=number),
        )


@check(
    ten_classes_one_channel,
    points=1,
    hint="End with nn.AdaptiveAvgPool2d((1, 1)), then nn.Sequential(nn.Flatten(), "
    "nn.Linear(512, num_classes)).",
)
def classifies_28x28_images(seen, ctx):
    """Two 28x28 grey images give a 2x10 output."""
    out = returned(seen)
    expect(
        out == [2, 10],
        _("the output has shape {got}, expected {wanted}").format(got=out, wanted=[2, 10]),
    )


@check(
    seven_classes_three_channels,
    points=1,
    hint="Use in_channels for the first convolution and num_classes for the last layer.",
)
def takes_96x96_colour_images_and_any_class_count(seen, ctx):
    """resnet18(7, in_channels=3) maps two 3x96x96 images to a 2x7 output."""
    expect(
        seen == [2, 7],
        _("the output has shape {got}, expected {wanted}").format(got=seen, wanted=[2, 7]),
    )


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if raised.type == "TypeError" and "Residual" in raised.message:  # (in any language)
        return _(
            "d2l.Residual takes (input_channels, num_channels, use_1x1conv=False, strides=1) "
            "as in d2l 2.0, or (num_channels, use_1x1conv=False, strides=1) as in d2l 1.0."
        )
    if "list is not a Module subclass" in raised.message:
        return _("Wrap each stage's list of blocks in nn.Sequential(*blocks).")
    return None
