"""Hidden checks of `resnet18`: the layers after the stem against the reference solution."""

from collections import Counter
from functools import cache

from grader.api import Fail, _, check_on, expect, seeded
from grader.exercises.resnet18.checks import layer_tree, layers, output_shape, recorded

POOLINGS = {"MaxPool2d", "AvgPool2d", "AdaptiveMaxPool2d", "AdaptiveAvgPool2d", "GlobalPool"}


@cache
def reference_layers(build) -> tuple:
    """Return the layers of the reference's resnet18(10), built once per process: they are the
    same for every submission, and building the network takes some 80 ms."""
    net, gen = build(10), seeded(0)
    output_shape(net, (2, 1, 28, 28), gen)
    return tuple(tuple(map(str, layer)) for layer in layers(recorded(net, gen)))


def shortcut(layer) -> bool:
    """Return True for a 1x1 convolution (a shortcut)."""
    return layer[0] == "Conv2d" and layer[1].endswith(", 1, 1]")


def pooling(layer) -> bool:
    """Return True for a pooling layer."""
    return layer[0] in POOLINGS


@check_on(
    layer_tree,
    points=1,
    hint="Match the book's layers: the same convolutions, global average pooling and linear layer.",
)
def same_layers_as_the_reference(seen, ctx):
    """The convolutions, poolings and linear layer that resnet18(10) runs after the stem are
    the reference's, of the same shapes and kinds, in any order: a global pooling counts as
    what it computes, the mean or the maximum.
    Property: the layers after the stem; against the reference (its layers; the one check
    charged for a layer of the wrong kind, as global max-pooling where the book averages)."""
    # A difference in the 1x1 shortcuts is shortcuts_only_where_the_shape_changes's cause,
    # one in the convolutions or linear layer the parameter count's, which it names: it
    # charges only where that passed. No other check sees the pooling, so this one charges it.
    got = Counter(tuple(map(str, layer)) for layer in seen)
    wanted = Counter(reference_layers(ctx.reference["resnet18"]))
    pools = sorted((Counter({k: n for k, n in got.items() if pooling(k)})).elements())
    wanted_pools = sorted((Counter({k: n for k, n in wanted.items() if pooling(k)})).elements())
    if pools != wanted_pools:
        raise Fail(
            _("after the stem it pools with {got}; expected {wanted}").format(
                got=[p[0] for p in pools], wanted=[p[0] for p in wanted_pools]
            ),
            _(
                "The book ends with global average pooling, nn.AdaptiveAvgPool2d((1, 1)): each "
                "channel's mean over the image. Max-pooling keeps only its largest value."
            )
            if any(p[0] == "AdaptiveMaxPool2d" for p in pools)
            else None,
        )
    # The slip of one part (a stage, a shortcut): a few layers off the reference's; a network
    # of other layers altogether is this check's own to charge.
    near = sum(((got - wanted) + (wanted - got)).values()) <= 4
    for part, owner in (
        (shortcut, "shortcuts_only_where_the_shape_changes"),
        (
            lambda layer: not shortcut(layer) and not pooling(layer),
            "stages_and_classifier_have_the_books_parameter_count",
        ),
    ):
        extra = sorted((Counter({k: n for k, n in got.items() if part(k)}) - wanted).elements())
        lacking = sorted((Counter({k: n for k, n in wanted.items() if part(k)}) - got).elements())
        expect(
            not extra and not lacking,
            _("it has the layers {extra} beyond the reference's and lacks {lacking}").format(
                extra=[list(x) for x in extra[:3]], lacking=[list(x) for x in lacking[:3]]
            ),
            see=owner if near else None,
        )
