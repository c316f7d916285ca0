"""Public checks of `resnet18(num_classes, in_channels=1)`: the book's ResNet-18 for 28x28."""

import torch
from torch import nn

from grader.api import case, check, expect

PARAMETERS = 11_175_818
STAGES = [
    "0",
    "1",
    "2",
    "resnet_block1",
    "resnet_block2",
    "resnet_block3",
    "resnet_block4",
    "global_avg_pool",
    "fc",
]
ORIGINAL_STEM = PARAMETERS + 64 * (7 * 7 - 3 * 3)  # a 7x7 first convolution instead of 3x3


def describe(net: nn.Module) -> dict:
    """Note the network's size, top-level names, stem and residual shortcuts."""
    children = list(net.named_children())
    stem = []
    for _, m in children[:3]:
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
        "parameters": sum(p.numel() for p in net.parameters()),
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
    """resnet18(10): its layout, and its output for two 28x28 images."""
    net = student.fn(10)
    return {"layout": describe(net), "out": output_shape(net, (2, 1, 28, 28), ctx.generator())}


@case
def seven_classes_three_channels(student, ctx):
    """resnet18(7, in_channels=3) on two 96x96 colour images."""
    net = student.fn(7, in_channels=3)
    return output_shape(net, (2, 3, 96, 96), ctx.generator())


def layers(net: nn.Module) -> list[list]:
    """Return [name, type, parameter shapes] for every module, in order."""
    return [
        [name, type(m).__name__, [list(p.shape) for p in m.parameters(recurse=False)]]
        for name, m in net.named_modules()
    ]


@case
def layer_tree(student, ctx):
    """Every module of resnet18(10), with its parameter shapes."""
    return layers(student.fn(10))


@check(
    ten_classes_one_channel,
    points=2,
    hint="Follow the book: a 3x3 stem with 64 channels, then four stages of two residual "
    "blocks with 64, 128, 256 and 512 channels, then a 512-to-10 linear layer.",
)
def has_11_175_818_parameters(seen, ctx):
    """resnet18(10) has 11,175,818 parameters."""
    count = seen["layout"]["parameters"]
    hint = None
    if count == ORIGINAL_STEM:
        hint = (
            "That is the count with the original 7x7 stem: the book's version for 28x28 "
            "images uses a 3x3 convolution with stride 1 and padding 1."
        )
    expect(count == PARAMETERS, f"it has {count:,} parameters, expected {PARAMETERS:,}", hint)


@check(
    ten_classes_one_channel,
    points=1,
    hint="Build nn.Sequential(conv, batch norm, ReLU), then add_module('resnet_block1', ...) "
    "up to 'resnet_block4', then 'global_avg_pool' and 'fc'.",
)
def names_its_stages_like_the_book(seen, ctx):
    """Its top-level modules are 0, 1, 2, resnet_block1..4, global_avg_pool and fc."""
    names = seen["layout"]["names"]
    expect(names == STAGES, f"its top-level modules are {names}, expected {STAGES}")


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
    expect(
        types == ["Conv2d", "BatchNorm2d", "ReLU"],
        f"the stem is {types}, expected ['Conv2d', 'BatchNorm2d', 'ReLU']",
    )
    conv = stem[0]
    got = (conv["kernel"], conv["stride"], conv["padding"], conv["channels"])
    expect(
        got == ([3, 3], [1, 1], [1, 1], [1, 64]),
        f"the first convolution has kernel {conv['kernel']}, stride {conv['stride']}, padding "
        f"{conv['padding']} and channels {conv['channels']}; expected 3x3, stride 1, padding 1, "
        "1 to 64",
    )
    expect(
        seen["layout"]["max_pools"] == 0,
        f"it has {seen['layout']['max_pools']} max-pooling layer(s), expected none",
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
        expect(len(blocks) == 2, f"resnet_block{number} has {len(blocks)} blocks, expected 2")
        first, second = blocks
        if number == 1:
            expect(
                not first["shortcut"] and first["stride"] == [1, 1],
                "the first block of resnet_block1 changes shape; the first stage keeps 64 "
                "channels and the full resolution",
            )
        else:
            expect(
                first["shortcut"]
                and first["shortcut_kernel"] == [1, 1]
                and first["stride"] == [2, 2],
                f"the first block of resnet_block{number} needs a 1x1 shortcut and stride 2",
            )
        expect(
            not second["shortcut"],
            f"the second block of resnet_block{number} has a 1x1 shortcut, expected the identity",
        )


@check(
    ten_classes_one_channel,
    points=1,
    hint="End with nn.AdaptiveAvgPool2d((1, 1)), then nn.Sequential(nn.Flatten(), "
    "nn.Linear(512, num_classes)).",
)
def classifies_28x28_images(seen, ctx):
    """Two 28x28 grey images give a 2x10 output."""
    expect(seen["out"] == [2, 10], f"the output has shape {seen['out']}, expected [2, 10]")


@check(
    seven_classes_three_channels,
    points=1,
    hint="Use in_channels for the first convolution and num_classes for the last layer.",
)
def takes_96x96_colour_images_and_any_class_count(seen, ctx):
    """resnet18(7, in_channels=3) maps two 3x96x96 images to a 2x7 output."""
    expect(seen == [2, 7], f"the output has shape {seen}, expected [2, 7]")


def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "Residual" in raised.message and "argument" in raised.message:
        return (
            "d2l.Residual here takes (input_channels, num_channels, use_1x1conv=False, "
            "strides=1), as in the book's PyTorch chapter."
        )
    if "list is not a Module subclass" in raised.message:
        return "Wrap each stage's list of blocks in nn.Sequential(*blocks)."
    return None
