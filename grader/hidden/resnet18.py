"""Hidden checks of `resnet18`: the whole layer tree against the reference solution."""

from torch import nn

from grader.api import case, check, expect


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


@check(layer_tree, points=1, hint="Match the book's layer order and names exactly.")
def same_layers_as_the_reference(seen, ctx):
    """Module for module, resnet18(10) has the reference's names, types and shapes."""
    wanted = layers(ctx.reference["resnet18"](10))
    for got, want in zip(seen, wanted, strict=False):
        expect(got == want, f"found layer {got}, expected {want}")
    expect(len(seen) == len(wanted), f"it has {len(seen)} modules, expected {len(wanted)}")
