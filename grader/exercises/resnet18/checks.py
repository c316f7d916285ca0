"""Public checks of `resnet18(num_classes, in_channels=1)`: the book's ResNet-18 for 28x28.

The checks judge what the network computes, read from a forward pass (`recorded_forward`),
never from its modules: the calls that ran, in order, with the parameters each used. The
stem is what runs before the first residual block (the block whose addition takes back its
input), so a ReLU called as `F.relu` in `forward`, a stem nested in an `nn.Sequential`, the
book's `d2l.Residual` (either edition's; d2l 1.0's learns its input channels at the first
pass, so each case runs the network once before recording), a block written with the
functional API and torchvision's `BasicBlock` are judged alike. Only
`names_its_stages_like_the_book` reads names.

Each property has one check. The stem has its own, and every other check leaves it aside,
so that the ImageNet stem (7x7 convolution and max-pooling, from the book's ResNet chapter)
costs only that check. The public checks compare with the book's numbers (sizes, counts);
the hidden `same_layers_as_the_reference` compares the layers after the stem with the
reference's, the only check charged for a wrong layer that no public check names (global
max-pooling where the book averages). A convolution's bias before batch norm, and batch
norm after a 1x1 shortcut (torchvision's way), change nothing the exercise asks for.
"""

import torch
from torch import nn

from grader.api import (
    LAYER_KINDS,
    Fail,
    _,
    attempt,
    case,
    check_on,
    error_hints,
    expect,
    recorded_forward,
    returned,
    seeded,
)

PARAMETERS = 11_175_818  # in all, for 10 classes
STEM_PARAMETERS = 64 * 1 * 3 * 3 + 64 + 2 * 64  # the 3x3 convolution and its batch norm
AFTER_THE_STEM = PARAMETERS - STEM_PARAMETERS  # 11,175,050 with the book's layers
CONV_BIASES = 2 * 2 * (64 + 128 + 256 + 512) + 128 + 256 + 512  # of the convolutions after it
SHORTCUT_NORMS = 2 * (128 + 256 + 512)  # batch norm after each 1x1 shortcut (torchvision's)
SHORTCUTS = [(64, 128, 2), (128, 256, 2), (256, 512, 2)]  # (in, out, stride) of the 1x1 convs
SHORTCUT_PARAMETERS = sum(i * o + o for i, o, _s in SHORTCUTS)  # with their biases
SHORTCUT_BIASES = 128 + 256 + 512
# The counts after the stem of the book's network and of the same network with the 3x3
# and/or the 1x1 convolutions without bias (batch norm or the sum's makes it redundant)
# and/or batch norm on the shortcuts; and of their paths without the shortcuts.
ACCEPTED = {
    AFTER_THE_STEM - b * (CONV_BIASES - SHORTCUT_BIASES) - s * SHORTCUT_BIASES + n * SHORTCUT_NORMS
    for b in (0, 1)
    for s in (0, 1)
    for n in (0, 1)
}
MAIN_PATH = {
    AFTER_THE_STEM - SHORTCUT_PARAMETERS - b * (CONV_BIASES - SHORTCUT_BIASES) for b in (0, 1)
}
STAGES = ["resnet_block1", "resnet_block2", "resnet_block3", "resnet_block4"]
NAMED = [*STAGES, "global_avg_pool", "fc"]


def ancestors(ops: list[dict], index: int) -> set[int]:
    """Return the calls whose results went into call `index`, itself included."""
    found, todo = set(), [index]
    while todo:
        i = todo.pop()
        if i not in found:
            found.add(i)
            todo += ops[i]["sources"] if i >= 0 else []
    return found


def block_input(ops: list[dict], skip: int, main: int) -> int | None:
    """Return the call that made a residual block's input, found from its addition's two
    operands: the first call on the skip operand's way back (through a 1x1 convolution and
    its batch norm, or none) that the main path also came from; None where none is."""
    came_from = ancestors(ops, main)
    at = skip
    while at not in came_from:
        if at < 0 or not ops[at]["sources"]:
            return None
        at = ops[at]["sources"][0]
    return at


def stem_length(ops: list[dict]) -> int:
    """Return how many calls make the stem: those before the first residual block, whose
    input the block's addition takes back (directly or through a 1x1 convolution); without
    any residual addition, those before the second convolution."""
    for i, op in enumerate(ops):
        if op["kind"] == "add" and len(op["sources"]) == 2:
            a, b = op["sources"]
            start = block_input(ops, a, b)
            start = block_input(ops, b, a) if start is None else start
            if start is not None and start < i:
                return start + 1
    convs = [i for i, op in enumerate(ops) if op["kind"] == "Conv2d"]
    return convs[1] if len(convs) > 1 else len(ops)


def parameters_of(ops: list[dict], sizes: list[int]) -> int:
    """Return the number of values of the parameters the calls used, each counted once."""
    return sum(sizes[p] for p in {p for op in ops for p in op["params"]})


def layer_entry(op: dict) -> dict:
    """Return a layer of the stem as a check reads it: its kind, and a convolution's sizes."""
    entry = {"type": op["kind"]}
    if op["kind"] == "Conv2d":
        entry.update({k: op[k] for k in ("kernel", "stride", "padding", "channels")})
    return entry


def describe(run: dict) -> dict:
    """Note what the network computed, from its recorded forward pass: its stem, the
    parameters after it and on its 1x1 shortcuts, its max-poolings and shortcuts."""
    ops, sizes = run["ops"], run["sizes"]
    length = stem_length(ops)
    stem_params = {p for op in ops[:length] for p in op["params"]}
    after = [{**op, "params": [p for p in op["params"] if p not in stem_params]} for op in ops]
    ones = [
        i
        for i, op in enumerate(ops[length:], start=length)
        if op["kind"] == "Conv2d" and op["kernel"] == [1, 1]
    ]
    shortcut_ops = [after[i] for i in ones] + [
        op for op in after if op["kind"] == "BatchNorm2d" and op["sources"][0] in ones
    ]
    return {
        "parameters": parameters_of(ops, sizes),
        "after_the_stem": parameters_of(after[length:], sizes),
        "shortcut_parameters": parameters_of(shortcut_ops, sizes),
        "stem": [layer_entry(op) for op in ops[:length] if op["kind"] in LAYER_KINDS],
        "max_pools": sum(op["kind"] == "MaxPool2d" for op in ops),
        "shortcuts": [ops[i]["channels"] + ops[i]["stride"][:1] for i in ones],
    }


def output_shape(net: nn.Module, shape: tuple[int, ...], gen: torch.Generator) -> list[int]:
    """Run the network in eval mode on a random batch and return the output's shape."""
    net.eval()
    with torch.no_grad():
        return list(net(torch.randn(shape, generator=gen)).shape)


def recorded(net: nn.Module, gen: torch.Generator) -> dict:
    """Run the network (which has run once, so that lazy layers are made) on two 28x28
    images, and return what it computed (`recorded_forward`)."""
    return recorded_forward(net, torch.randn((2, 1, 28, 28), generator=gen))


@case
def ten_classes_one_channel(student, ctx):
    """resnet18(10): its output for two 28x28 images, then what it computes, as its forward
    pass shows it, and its top-level names."""
    net = student.fn(10)
    gen = seeded(ctx.seed)
    out = attempt(output_shape, net, (2, 1, 28, 28), gen)
    layout = describe(recorded(net, gen))
    names = [name for name, _ in net.named_children()]
    return {"returned": out.returned, "raised": out.raised, "layout": {**layout, "names": names}}


@case
def seven_classes_three_channels(student, ctx):
    """resnet18(7, in_channels=3) on two 96x96 colour images."""
    net = student.fn(7, in_channels=3)
    return output_shape(net, (2, 3, 96, 96), seeded(ctx.seed))


def layers(run: dict) -> list[list]:
    """Return [kind, sizes] of every convolution, pooling and linear layer after the stem, in
    the order they ran: a convolution's and a linear layer's weight shape, a pooling's
    kernel or output size. Global pooling is named by what it computes (the mean or the
    maximum), whatever function did it."""
    ops = run["ops"]
    return [
        [op["kind"], op.get("weight") or op.get("size") or op.get("kernel")]
        for op in ops[stem_length(ops) :]
        if op["kind"] in LAYER_KINDS - {"BatchNorm2d", "ReLU"} or op["kind"] == "GlobalPool"
    ]


@case
def layer_tree(student, ctx):
    """Every convolution, pooling and linear layer that resnet18(10) runs after the stem, with
    its sizes, in a forward pass on two 28x28 images after a first one."""
    net = student.fn(10)
    gen = seeded(ctx.seed)
    output_shape(net, (2, 1, 28, 28), gen)
    return layers(recorded(net, gen))


@check_on(
    ten_classes_one_channel,
    points=2,
    hint="Follow the book: four stages of two residual blocks with 64, 128, 256 and 512 "
    "channels, then a 512-to-num_classes linear layer.",
)
def stages_and_classifier_have_the_books_parameter_count(seen, ctx):
    """After the stem, the parameters the forward pass uses number the book's 11,175,050, or
    as many as the same network has without the biases of its convolutions or with batch norm
    after its 1x1 shortcuts (as torchvision's).
    Property: the stages, pooling and classifier are the book's size; against the reference
    (the book's count, a constant: 11,175,050 after the stem, which has its own check, and
    11,175,818 with its 3x3 stem; or as many as the same network has without the biases of
    its 3x3 or of its 1x1 convolutions, or with batch norm after its 1x1 shortcuts, as
    torchvision's)."""
    # 11,170,314, 11,176,842 or 11,172,106 (torchvision's), and their mixtures. A count that
    # is right but for the shortcuts is shortcuts_only_where_the_shape_changes's cause.
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


@check_on(
    ten_classes_one_channel,
    points=1,
    hint="After the stem, add_module('resnet_block1', ...) up to 'resnet_block4', then "
    "'global_avg_pool' and 'fc'.",
)
def names_its_stages_like_the_book(seen, ctx):
    """After the stem come the top-level modules resnet_block1 to resnet_block4,
    global_avg_pool and fc, in that order: the book's names, which the notebook's later cells
    use.
    Property: the book's names; against the reference (the book's names, in order, among the
    top-level modules; the one check that reads the module tree)."""
    names = seen["layout"]["names"]
    expect(
        [n for n in names if n in NAMED] == NAMED,
        _("its top-level modules are {names}; expected the stem, then {named}").format(
            names=names, named=NAMED
        ),
    )


@check_on(
    ten_classes_one_channel,
    points=1,
    hint="For 28x28 images the book uses Conv2d(in_channels, 64, kernel_size=3, stride=1, "
    "padding=1), BatchNorm2d(64) and ReLU, and no max-pooling.",
)
def stem_is_3x3_stride_1_without_max_pooling(seen, ctx):
    """Before the first residual block run a 3x3 convolution of stride 1 and padding 1 to 64
    channels, batch norm and ReLU, and no max-pooling runs anywhere: the book's stem for 28x28
    images.
    Property: the stem for 28x28 images; against the reference (the book's stem, constants;
    global max-pooling is same_layers_as_the_reference's)."""
    # An nn.Identity in the stem (torchvision's way to drop its max-pool) computes nothing.
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


@check_on(
    ten_classes_one_channel,
    points=1,
    hint="Only the first block of stages 2 to 4 changes shape: give it use_1x1conv=True and "
    "strides=2; every other block keeps the identity shortcut.",
)
def shortcuts_only_where_the_shape_changes(seen, ctx):
    """Stages 2 to 4 open with a block of stride 2 with a 1x1 shortcut, and no other block
    has one: three 1x1 convolutions of stride 2, from 64 to 128, 128 to 256 and 256 to 512
    channels.
    Property: the shortcuts; against the reference (the book's shortcuts, constants: the 1x1
    convolutions that run after the stem)."""
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


@check_on(
    ten_classes_one_channel,
    points=1,
    hint="End with nn.AdaptiveAvgPool2d((1, 1)), then nn.Sequential(nn.Flatten(), "
    "nn.Linear(512, num_classes)).",
)
def classifies_28x28_images(seen, ctx):
    """resnet18(10) maps two 28x28 grey images to a 2x10 output.
    Property: the output for the book's images; against the reference (the shape the
    exercise states)."""
    out = returned(seen)
    expect(
        out == [2, 10],
        _("the output has shape {got}, expected {wanted}").format(got=out, wanted=[2, 10]),
    )


@check_on(
    seven_classes_three_channels,
    points=1,
    hint="Use in_channels for the first convolution and num_classes for the last layer.",
)
def takes_96x96_colour_images_and_any_class_count(seen, ctx):
    """resnet18(7, in_channels=3) maps two 3x96x96 colour images to a 2x7 output.
    Property: in_channels and num_classes are used; against the reference (the shape the
    exercise states)."""
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
