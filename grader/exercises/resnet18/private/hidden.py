"""Hidden checks of `resnet18`: the layers after the stem against the reference solution."""

from collections import Counter
from functools import cache

from grader.api import _, check, expect
from grader.exercises.resnet18.checks import layer_tree, layers


@cache
def reference_layers(build) -> tuple:
    """Return the layers of the reference's resnet18(10), built once per process: they are the
    same for every submission, and building the network takes some 80 ms."""
    return tuple(tuple(map(str, layer)) for layer in layers(build(10)))


def shortcut(layer) -> bool:
    """Return True for a 1x1 convolution (a shortcut)."""
    return layer[0] == "Conv2d" and layer[1].endswith(", 1, 1]")


@check(
    layer_tree, points=1, hint="Match the book's layers: the same convolutions and linear layer."
)
def same_layers_as_the_reference(seen, ctx):
    """After the stem, resnet18(10) has the reference's convolutions and linear layer, of the
    same shapes, wherever they sit."""
    # A difference in the 1x1 shortcuts is shortcuts_only_where_the_shape_changes's cause,
    # any other the parameter count's, which it names: it charges only where that passed.
    got = Counter(tuple(map(str, layer)) for layer in seen)
    wanted = Counter(reference_layers(ctx.reference["resnet18"]))
    # The slip of one part (a stage, a shortcut): a few layers off the reference's; a network
    # of other layers altogether is this check's own to charge.
    near = sum(((got - wanted) + (wanted - got)).values()) <= 4
    for part, owner in (
        (shortcut, "shortcuts_only_where_the_shape_changes"),
        (lambda layer: not shortcut(layer), "stages_and_classifier_have_the_books_parameter_count"),
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
