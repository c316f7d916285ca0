"""Hidden checks of `resnet18`: the layer tree after the stem against the reference solution."""

from grader.api import check, expect
from grader.checks.resnet18 import layer_tree, layers

# The reference's layer tree, by its resnet18 function: the same for every submission, and
# building the network costs some 80 ms (a class grades many submissions in one process).
_reference_layers: dict[object, list] = {}


@check(layer_tree, points=1, hint="Match the book's layers, in the book's order.")
def same_layers_as_the_reference(seen, ctx):
    """Module for module after the stem, resnet18(10) has the reference's types and shapes."""
    build = ctx.reference["resnet18"]
    if build not in _reference_layers:
        _reference_layers[build] = layers(build(10))
    wanted = _reference_layers[build]
    for got, want in zip(seen, wanted, strict=False):
        expect(got == want, f"found layer {got}, expected {want}")
    expect(len(seen) == len(wanted), f"it has {len(seen)} modules, expected {len(wanted)}")
