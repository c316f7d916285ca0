"""Public checks of `get_params(params, device)`: fresh trainable copies on one device."""

import torch
from torch import nn

import dplab
from grader.api import (
    N_,
    Fail,
    SeenTensor,
    _,
    case,
    check_on,
    error_hints,
    expect,
    expect_close,
    expect_equal,
    lenet_loss,
    observe,
    random_batch,
    seeded,
    short,
)

SAME_TENSOR_HINT = N_(
    "`.to(device)` returns the very same tensor when it is already on that device, so the "
    "copies share memory with the originals (and with each other): every device would train "
    "one model. Copy explicitly, e.g. with .clone() after .detach()."
)


def copies_of(seen, count: int = 8) -> list[SeenTensor]:
    """Return the copies as a list of tensors, or fail saying what came back instead."""
    if not (isinstance(seen, list | tuple) and all(isinstance(t, SeenTensor) for t in seen)):
        raise Fail(
            _("get_params returned {got}, expected a list of {count} tensors").format(
                got=short(seen), count=count
            )
        )
    expect(
        len(seen) == count,
        _("get_params returned {got} tensors for {count} parameters").format(
            got=len(seen), count=count
        ),
    )
    return list(seen)


IN_ORDER = N_("copy i is compared with parameter i, which needs one copy per parameter, in order")


def tensors_of(seen) -> list[SeenTensor]:
    """Return every tensor get_params returned, however many; without a list of tensors
    there is nothing to look at (returns_one_copy_per_parameter judges that)."""
    observe(
        isinstance(seen, list | tuple) and all(isinstance(t, SeenTensor) for t in seen),
        "returns_one_copy_per_parameter",
        N_("get_params returned no list of tensors to look at"),
    )
    return list(seen)


@case
def book_demo(student, ctx):
    """The book's demo: copy LeNet's parameters to the first device."""
    params = dplab.lenet_params(seed=ctx.seed)
    copies = student.fn(params, ctx.devices[0])
    return {"copies": copies, "originals": params}


@case
def to_the_second_device(student, ctx):
    """Copy LeNet's parameters to the second device."""
    return student.fn(dplab.lenet_params(seed=ctx.seed), ctx.devices[1])


@case
def copy_in_place_then_change(student, ctx, trainable: bool = False, factor: float = 1.0):
    """Copy parameters that already live on the target device (as nn.Parameter objects if
    `trainable`), then add 1 to every copy and multiply it by `factor`."""
    params = [p.to(ctx.devices[0]) for p in dplab.lenet_params(seed=ctx.seed)]
    if trainable:
        params = [nn.Parameter(p) for p in params]
    copies = student.fn(params, ctx.devices[0])
    with torch.no_grad():
        for c in copies:
            c.add_(1).mul_(factor)
    return {"copies": copies, "originals": params}


onto_the_same_device = copy_in_place_then_change.using(
    "onto_the_same_device", "Copy parameters onto their own device, then change the copies."
)


@case
def backward_through_the_copies(student, ctx):
    """Run LeNet on a batch with the copies and call backward on the summed loss."""
    copies = student.fn(dplab.lenet_params(seed=ctx.seed), ctx.devices[0])
    X, y = random_batch(seeded(ctx.seed), 4)
    lenet_loss(dplab.lenet(X.to(ctx.devices[0]), copies), y.to(ctx.devices[0])).sum().backward()
    return copies


@check_on(book_demo, points=1, hint="Return a list with one copy of each parameter, in order.")
def returns_one_copy_per_parameter(seen, ctx):
    """It returns a list of eight tensors shaped like LeNet's parameters.
    Property: one copy per parameter; against the reference (LeNet's shapes)."""
    copies = copies_of(seen["copies"])
    for i, (c, p) in enumerate(zip(copies, dplab.lenet_params(seed=ctx.seed), strict=True)):
        expect(
            c.shape == tuple(p.shape),
            _("copy {i} has shape {got}, expected {wanted}").format(
                i=i, got=c.shape, wanted=tuple(p.shape)
            ),
        )


@check_on(
    book_demo,
    points=1,
    hint="Copy the values unchanged.",
    after="returns_one_copy_per_parameter",
    because=IN_ORDER,
)
def copies_hold_the_same_values(seen, ctx):
    """Each copy holds its parameter's values.
    Property: the copies' values; a relation: each copy against its own original."""
    for i, (c, p) in enumerate(zip(seen["copies"], dplab.lenet_params(seed=ctx.seed), strict=True)):
        expect_close(c, p, _("copy {i}").format(i=i), rtol=0, atol=0)


@check_on(
    book_demo,
    points=1,
    hint="b1 starts as zeros; its copy must be a leaf whose grad is None.",
    after="returns_one_copy_per_parameter",
    because=IN_ORDER,
)
def b1_is_twenty_zeros_with_no_grad(seen, ctx):
    """The book's demo: the copy of b1 is 20 zeros and its grad is None.
    Property: the book's demo; against the reference (its known output)."""
    b1 = seen["copies"][1]
    # Its value and its grad are judged for every copy by the checks this one names.
    expect_equal(b1, torch.zeros(20), _("the copy of b1"), see="copies_hold_the_same_values")
    if b1.grad is not None:
        raise Fail(
            _("the copy of b1 already has a grad: {grad}").format(grad=short(b1.grad)),
            see="copies_are_leaves_that_require_grad",
        )


@check_on(
    to_the_second_device,
    points=1,
    hint="Move each copy with .to(device).",
)
def copies_are_on_the_device(seen, ctx):
    """Every copy lives on the device it was asked for.
    Property: where the copies are; against the reference (the device asked for)."""
    wanted = str(ctx.devices[1])
    for i, c in enumerate(tensors_of(seen)):
        expect(
            c.device == wanted,
            _("copy {i} is on {got}, expected {wanted}").format(i=i, got=c.device, wanted=wanted),
        )


@check_on(
    book_demo,
    points=1,
    hint="Call .requires_grad_() on each copy.",
)
def copies_are_leaves_that_require_grad(seen, ctx):
    """Each copy is a leaf tensor that requires grad and has no grad yet.
    Property: the copies can be trained; against the reference (a leaf that requires grad, with
    no grad yet)."""
    for i, c in enumerate(tensors_of(seen["copies"])):
        expect(
            c.requires_grad,
            _("copy {i} does not require grad, so SGD would never update it").format(i=i),
        )
        expect(
            c.is_leaf,
            _("copy {i} is not a leaf tensor: its .grad stays None after backward").format(i=i),
        )
        expect(c.grad is None, _("copy {i} already has a grad").format(i=i))


@check_on(onto_the_same_device, points=2, hint=SAME_TENSOR_HINT)
def copies_are_independent_of_the_originals(seen, ctx):
    """Changing a copy leaves its original alone, even when both are on the same device.
    Property: independence; a relation: a copy changed against its original, which must not move."""
    # No copy is an original, whatever the number of copies; and every original keeps its values.
    originals = seen["originals"]
    for i, c in enumerate(tensors_of(seen["copies"])):
        for p in originals:
            if c.ptr == p.ptr or c.ident == p.ident:
                raise Fail(_("copy {i} is the original tensor itself (same memory)").format(i=i))
    for i, p in enumerate(originals):
        expect_close(
            p,
            dplab.lenet_params(seed=ctx.seed)[i],
            _("original {i} after changing its copy").format(i=i),
            rtol=0,
            atol=0,
        )


@check_on(
    book_demo,
    points=1,
    hint="Leave the caller's tensors alone: set requires_grad on the copies only.",
)
def originals_are_left_untouched(seen, ctx):
    """The parameters passed in keep their values and still do not require grad.
    Property: the originals are kept; a relation: the originals after the call against before it."""
    tensors_of(seen["copies"])  # without copies, leaving the originals alone is no feat
    for i, p in enumerate(seen["originals"]):
        expect(isinstance(p, SeenTensor), _("original {i} is no longer a tensor").format(i=i))
        expect(
            not p.requires_grad,
            _("original {i} now requires grad: get_params changed the tensor it was given").format(
                i=i
            ),
            SAME_TENSOR_HINT,
        )


@check_on(
    backward_through_the_copies,
    points=1,
    hint="The copies must be leaves that require grad, so backward fills their .grad.",
    after="returns_one_copy_per_parameter",
    because=IN_ORDER,
)
def gradients_reach_the_copies(seen, ctx):
    """After backward through LeNet, every copy holds the gradient of the loss.
    Property: gradients reach the copies; against the reference (autograd's gradients on the
    originals)."""
    params = [p.requires_grad_() for p in dplab.lenet_params(seed=ctx.seed)]
    X, y = random_batch(seeded(ctx.seed), 4)
    lenet_loss(dplab.lenet(X, params), y).sum().backward()
    for i, (c, p) in enumerate(zip(copies_of(seen), params, strict=True)):
        expect(
            c.grad is not None,
            _("copy {i} has no grad after backward").format(i=i),
            see=None if c.is_leaf else "copies_are_leaves_that_require_grad",
        )
        expect_close(c.grad, p.grad, _("the grad of copy {i}").format(i=i))


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "require_grad_" in raised.message:
        return _("The method is requires_grad_(), with an s.")
    if raised.type == "TypeError" and "list" in raised.message and "device" in raised.message:
        return _("get_params takes one device (not a list) and returns one list of copies.")
    return None
