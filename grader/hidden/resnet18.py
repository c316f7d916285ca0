"""Hidden checks of `resnet18`: the layer tree after the stem against the reference solution."""

from grader.api import check, expect
from grader.checks.resnet18 import layer_tree, layers


@check(layer_tree, points=1, hint="Match the book's layers, in the book's order.")
def same_layers_as_the_reference(seen, ctx):
    """Module for module after the stem, resnet18(10) has the reference's types and shapes."""
    wanted = layers(ctx.reference["resnet18"](10))
    for got, want in zip(seen, wanted, strict=False):
        expect(got == want, f"found layer {got}, expected {want}")
    expect(len(seen) == len(wanted), f"it has {len(seen)} modules, expected {len(wanted)}")
