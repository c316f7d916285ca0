"""Hidden checks of `get_params`."""

import dplab
from grader.api import _, check_on, expect, expect_close
from grader.exercises.get_params.checks import (
    SAME_TENSOR_HINT,
    copies_of,
    copy_in_place_then_change,
)

parameters_that_require_grad = copy_in_place_then_change.using(
    "parameters_that_require_grad",
    "Copy nn.Parameter objects (which already require grad) onto their own device, then "
    "change the copies.",
    trainable=True,
    factor=2.0,
)


@check_on(parameters_that_require_grad, points=2, hint=SAME_TENSOR_HINT)
def copies_trainable_parameters_independently(seen, ctx):
    """Parameters that already require grad still get independent leaf copies.
    Property: the same, for parameters that require grad; against the reference (the values
    expected), each cause a public check judges on plain tensors left to it (see=)."""
    # Each failure has the cause of a public check on plain tensors, which it names: it
    # charges only where that check passed (parameters that require grad are the new part).
    expected = dplab.lenet_params(seed=ctx.seed)
    for i, (c, p) in enumerate(zip(copies_of(seen["copies"]), seen["originals"], strict=True)):
        expect(
            c.is_leaf and c.requires_grad,
            _("copy {i} is not a leaf that requires grad").format(i=i),
            see="copies_are_leaves_that_require_grad",
        )
        expect(
            c.ptr != p.ptr,
            _("copy {i} shares memory with its original").format(i=i),
            see="copies_are_independent_of_the_originals",
        )
        changed = _("original {i} after changing its copy").format(i=i)
        expect_close(
            p, expected[i], changed, rtol=0, atol=0, see="copies_are_independent_of_the_originals"
        )
        expect_close(
            c,
            (expected[i] + 1) * 2,
            _("copy {i} after changing it").format(i=i),
            rtol=0,
            atol=0,
            see="copies_hold_the_same_values",
        )
