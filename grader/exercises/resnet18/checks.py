"""Public checks of `resnet18(num_classes, in_channels=1)`: the book's ResNet-18 for 28x28.

The stem has a check of its own, and every other check leaves it aside, so that the
ImageNet stem (7x7 convolution and max-pooling, from the book's ResNet chapter) costs only
that check. Either edition's `d2l.Residual` works; d2l 1.0's learns its input channels at
the first forward pass, so each case runs the network once before looking at its layers.

The checks look at what the network is, not at how it is spelt: the layers are found by
their kind and shape, wherever they sit and whatever they are called, so torchvision's
`resnet18` with a 3x3 stem and `maxpool = nn.Identity()` is judged as the book's is. Only
`names_its_stages_like_the_book` reads names. A convolution's bias before batch norm, and
batch norm after a 1x1 shortcut (torchvision's way), change nothing the exercise asks for.
"""

import torch
from torch import nn

from grader.api import Fail, _, attempt, case, check, error_hints, expect, returned, seeded

PARAMETERS = 11_175_818  # in all, for 10 classes
STEM_PARAMETERS = 64 * 1 * 3 * 3 + 64 + 2 * 64  # the 3x3 convolution and its batch norm
AFTER_THE_STEM = PARAMETERS - STEM_PARAMETERS  # 11,175,050 with the book's layers
CONV_BIASES = 2 * 2 * (64 + 128 + 256 + 512) + 128 + 256 + 512  # of the convolutions after it
SHORTCUT_NORMS = 2 * (128 + 256 + 512)  # batch norm after each 1x1 shortcut (torchvision's)
SHORTCUTS = [(64, 128, 2), (128, 256, 2), (256, 512, 2)]  # (in, out, stride) of the 1x1 convs
SHORTCUT_PARAMETERS = sum(i * o + o for i, o, _s in SHORTCUTS)  # with their biases
# The counts after the stem of the book's network and of the same network with convolutions
# without bias and/or batch norm on the shortcuts; and of their paths without the shortcuts.
ACCEPTED = {AFTER_THE_STEM - b * CONV_BIASES + n * SHORTCUT_NORMS for b in (0, 1) for n in (0, 1)}
MAIN_PATH = {
    AFTER_THE_STEM - SHORTCUT_PARAMETERS - b * (CONV_BIASES - 128 - 256 - 512) for b in (0, 1)
}
STAGES = ["resnet_block1", "resnet_block2", "resnet_block3", "resnet_block4"]
NAMED = [*STAGES, "global_avg_pool", "fc"]


def count(module: nn.Module) -> int | None:
    """Return the number of parameters, or None while some are not yet made (lazy layers)."""
    try:
        return sum(p.numel() for p in module.parameters())
    except ValueError:  # an uninitialized parameter of a lazy layer
        return None


def convolutions(net: nn.Module) -> list[dict]:
    """Return every Conv2d after the stem, in order: kernel, stride, channels, parameters."""
    found = []
    for _name, top in list(net.named_children())[stem_length(net) :]:
        for m in top.modules():
            if isinstance(m, nn.Conv2d):
                found.append(
                    {
                        "kernel": list(m.kernel_size),
                        "stride": list(m.stride),
                        "channels": [m.in_channels, m.out_channels],
                        "parameters": count(m) or 0,
                    }
                )
    return found


def shortcut_norms(net: nn.Module) -> int:
    """Return the parameters of batch norms paired with a 1x1 convolution as a shortcut of
    their own (torchvision's `downsample = Sequential(conv1x1, BatchNorm2d)`)."""
    total = 0
    for m in net.modules():
        layers = list(m.children())
        if (
            isinstance(m, nn.Sequential)
            and len(layers) == 2
            and isinstance(layers[0], nn.Conv2d)
            and layers[0].kernel_size == (1, 1)
            and isinstance(layers[1], nn.BatchNorm2d)
        ):
            total += count(layers[1]) or 0
    return total


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
        if isinstance(m, nn.Identity):  # torchvision's way to take a layer out
            continue
        entry = {"type": type(m).__name__}
        if isinstance(m, nn.Conv2d):
            entry.update(
                kernel=list(m.kernel_size),
                stride=list(m.stride),
                padding=list(m.padding),
                channels=[m.in_channels, m.out_channels],
            )
        stem.append(entry)
    convs = convolutions(net)
    ones = [c for c in convs if c["kernel"] == [1, 1]]
    return {
        "parameters": count(net),
        "after_the_stem": sum(count(m) or 0 for _name, m in children[stem_length(net) :]),
        "shortcut_parameters": sum(c["parameters"] for c in ones) + shortcut_norms(net),
        "names": [name for name, _ in children],
        "stem": stem,
        "max_pools": sum(isinstance(m, nn.MaxPool2d) for m in net.modules()),
        "shortcuts": [c["channels"] + c["stride"][:1] for c in ones],
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
    """Return [kind, weight shape] of every convolution and linear layer after the stem, in
    the order they were registered (what they compute with, whatever holds them)."""
    return [
        [kind, list(m.weight.shape)]
        for _name, top in list(net.named_children())[stem_length(net) :]
        for m in top.modules()
        for kind in [{nn.Conv2d: "Conv2d", nn.Linear: "Linear"}.get(type(m))]
        if kind is not None
    ]


@case
def layer_tree(student, ctx):
    """Every convolution and linear layer of resnet18(10) after the stem, with its weight's
    shape, once the network has run on two 28x28 images."""
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
    """After the stem (which has its own check), resnet18(10) has the book's 11,175,050
    parameters (11,175,818 with its 3x3 stem), or as many as the same network has without
    the convolutions' biases or with batch norm after its 1x1 shortcuts, as torchvision's."""
    # 11,170,314, 11,176,842 or 11,172,106 (torchvision's). A count that is right but for the
    # shortcuts is shortcuts_only_where_the_shape_changes's cause.
    layout = seen["layout"]
    got = layout["after_the_stem"]
    expect(
        got in ACCEPTED,
        _(
            "its stages, pooling and classifier have {got} parameters, expected {wanted} "
            "({total} with the stem)"
        ).format(got=f"{got:,}", wanted=f"{AFTER_THE_STEM:,}", total=f"{PARAMETERS:,}"),
        see="shortcuts_only_where_the_shape_changes"
        if got - layout["shortcut_parameters"] in MAIN_PATH
        else None,
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
    # An nn.Identity in the stem (torchvision's way to drop its max-pool) is no layer.
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
    """Stages 2-4 open with a strided block with a 1x1 shortcut; no other block has one: its
    1x1 convolutions, wherever they sit, are three of stride 2, from 64 to 128, 128 to 256
    and 256 to 512 channels."""
    found = seen["layout"]["shortcuts"]
    for c_in, c_out, _stride in found:
        if c_in == c_out:
            raise Fail(
                _(
                    "a block that keeps {channels} channels has a 1x1 shortcut; only the first "
                    "block of stages 2 to 4 changes shape"
                ).format(channels=c_in)
            )
    for c_in, c_out, stride in SHORTCUTS:
        same = [f for f in found if f[:2] == [c_in, c_out]]
        expect(
            same,
            _("the stage from {c_in} to {c_out} channels has no 1x1 shortcut").format(
                c_in=c_in, c_out=c_out
            ),
        )
        expect(
            [f[2] for f in same] == [stride],
            _(
                "the 1x1 shortcuts from {c_in} to {c_out} channels have strides {got}, "
                "expected one of stride 2"
            ).format(c_in=c_in, c_out=c_out, got=[f[2] for f in same]),
        )
    expect(
        len(found) == len(SHORTCUTS),
        _("it has {count} 1x1 convolutions, expected 3 shortcuts").format(count=len(found)),
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
