"""Known wrong versions of `ShardedOptimizer`, from one template of a right one."""

from grader.exercises.catalogue import Mistake, variant

TEMPLATE = """
class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        rank, world = dist.get_rank(), dist.get_world_size()
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.numel = flat.numel()
        self.shard = flat.tensor_split(world)[rank].clone().requires_grad_()
        <<INNER>>

    def gradient_chunk(self):
        rank, world = dist.get_rank(), dist.get_world_size()
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        return <<GRAD>>

    def step(self):
        self.shard.grad = self.gradient_chunk()
        self.optimizer.step()
        <<GATHER>>
        with torch.no_grad():
            for p, values in zip(self.params, flat.split([p.numel() for p in self.params])):
                p.copy_(values.view_as(p))

    def zero_grad(self):
        <<ZERO>>
"""

RIGHT = {
    "INNER": "self.optimizer = optimizer_cls([self.shard], **kwargs)",
    "GRAD": "grads.tensor_split(world)[rank]",
    "GATHER": "flat = all_gather(self.shard.detach(), self.numel)",
    "ZERO": """for p in self.params:
            p.grad = None""",
}

never_shares_the_chunks = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        GATHER="""flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        rank, world = dist.get_rank(), dist.get_world_size()
        flat.tensor_split(world)[rank].copy_(self.shard.detach())""",
    ),
    fails="weights_match_one_process",
    hint_mentions="never changed",
)

optimizer_over_every_parameter = Mistake(
    source="""
class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = optimizer_cls(self.params, **kwargs)

    def step(self):
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad()
""",
    fails="each_value_has_its_state_on_one_rank",
    hint_mentions="not over every parameter",
    seen_in="a wrapper that keeps the plain optimizer: right weights, no memory saved",
)

averages_the_gradient_again = Mistake(
    source=variant(TEMPLATE, RIGHT, GRAD="grads.tensor_split(world)[rank] / world"),
    fails="weights_match_one_process",
    hint_mentions="all_gather the",
    seen_in="the gradient divided by the world size once more, after DDP's averaging",
)

forgets_the_settings = Mistake(
    source=variant(TEMPLATE, RIGHT, INNER="self.optimizer = optimizer_cls([self.shard])"),
    fails="weights_match_one_process",
    hint_mentions="step the inner optimizer",
)

zero_grad_left_out = Mistake(
    source=variant(TEMPLATE, RIGHT, ZERO="pass"),
    fails="zero_grad_clears_the_gradients",
    hint_mentions="p.grad",
)

shards_the_frozen_parameters_too = Mistake(
    source=variant(TEMPLATE, RIGHT).replace(
        "self.params = [p for p in params if p.requires_grad]", "self.params = list(params)"
    ),
    fails="shards_only_the_parameters_that_train",
    hint_mentions="frozen",
    seen_in="every parameter flattened, frozen ones (no gradient) included",
)
