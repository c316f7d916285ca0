"""Known wrong versions of `get_params`."""

from grader.exercises.catalogue import Mistake

to_device_without_copying = Mistake(
    source="""
def get_params(params, device):
    new_params = [p.to(device) for p in params]
    for p in new_params:
        p.requires_grad_()
    return new_params
""",
    fails="copies_are_independent_of_the_originals",
    hint_mentions="returns the very same tensor",
    seen_in="the book's own version, and the seed notes, whose printed b1 shows requires_grad=True",
)

misspelt_requires_grad = Mistake(
    source="""
def get_params(params, device):
    new_params = [p.clone().to(device) for p in params]
    for p in new_params:
        p.require_grad_()
    return new_params
""",
    fails="returns_one_copy_per_parameter",
    hint_mentions="requires_grad_(), with an s",
    seen_in="seed notes: param.require_grad_()",
)

forgets_requires_grad = Mistake(
    source="""
def get_params(params, device):
    return [p.clone().to(device) for p in params]
""",
    fails="copies_are_leaves_that_require_grad",
    hint_mentions=".requires_grad_()",
)

copies_that_are_not_leaves = Mistake(
    source="""
def get_params(params, device):
    leaves = [p.detach().clone().to(device).requires_grad_() for p in params]
    return [p * 1 for p in leaves]
""",
    fails="copies_are_leaves_that_require_grad",
    hint_mentions=".requires_grad_()",
)
