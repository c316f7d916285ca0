"""Hidden checks of `resnet18`: the layer tree after the stem against the reference solution."""

from functools import cache

from grader.api import _, check, expect
from grader.checks.resnet18 import layer_tree, layers


@cache
def reference_layers(build) -> list:
    """Return the layer tree of the reference's resnet18(10), built once per process: it is
    the same for every submission, and building the network takes some 80 ms."""
    return layers(build(10))


@check(layer_tree, points=1, hint="Match the book's layers, in the book's order.")
def same_layers_as_the_reference(seen, ctx):
    """Module for module after the stem, resnet18(10) has the reference's types and shapes."""
    wanted = reference_layers(ctx.reference["resnet18"])
    for got, want in zip(seen, wanted, strict=False):
        expect(got == want, _("found layer {got}, expected {want}").format(got=got, want=want))
    expect(
        len(seen) == len(wanted),
        _("it has {count} modules, expected {wanted}").format(count=len(seen), wanted=len(wanted)),
    )
