"""Known wrong versions of `average_gradients`."""

from grader.exercises.catalogue import Mistake

sums_without_dividing = Mistake(
    source="""
def average_gradients(model):
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad)
""",
    fails="gradients_are_the_mean_over_ranks",
    hint_mentions="divide each by",
)

averages_the_weights = Mistake(
    source="""
def average_gradients(model):
    world = dist.get_world_size()
    for param in model.parameters():
        dist.all_reduce(param.data)
        param.data /= world
""",
    fails="gradients_are_the_mean_over_ranks",
    hint_mentions="not to their gradients",
)

trips_over_frozen_parameters = Mistake(
    source="""
def average_gradients(model):
    world = dist.get_world_size()
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= world
""",
    fails="skips_frozen_parameters",
    hint_mentions="Skip it",
)

averages_a_copy = Mistake(
    source="""
def average_gradients(model):
    world = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            grad = param.grad.clone()
            dist.all_reduce(grad)
            grad = grad / world
""",
    fails="gradients_are_the_mean_over_ranks",
    hint_mentions="in place",
)
