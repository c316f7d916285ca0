"""Hidden checks of `get_params`."""

import torch
from torch import nn

import dplab
from grader.api import case, check, expect, expect_close
from grader.checks.get_params import SAME_TENSOR_HINT, copies_of


@case
def parameters_that_require_grad(student, ctx):
    """Copy nn.Parameter objects (which already require grad) onto their own device."""
    params = [nn.Parameter(p.to(ctx.devices[0])) for p in dplab.lenet_params(seed=ctx.seed)]
    copies = student.fn(params, ctx.devices[0])
    with torch.no_grad():
        for c in copies:
            c.mul_(2)
    return {"copies": copies, "originals": params}


@check(parameters_that_require_grad, points=2, hint=SAME_TENSOR_HINT)
def copies_trainable_parameters_independently(seen, ctx):
    """Parameters that already require grad still get independent leaf copies."""
    expected = dplab.lenet_params(seed=ctx.seed)
    for i, (c, p) in enumerate(zip(copies_of(seen["copies"]), seen["originals"], strict=True)):
        expect(c.is_leaf and c.requires_grad, f"copy {i} is not a leaf that requires grad")
        expect(c.ptr != p.ptr, f"copy {i} shares memory with its original")
        expect_close(p, expected[i], f"original {i} after doubling its copy", rtol=0, atol=0)
        expect_close(c, expected[i] * 2, f"copy {i} after doubling it", rtol=0, atol=0)
