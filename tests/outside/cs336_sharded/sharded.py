# Slips, and the check each must cost: none. Habits of students' work on the sharded
# optimizer of a systems course (CS336-style assignments) that a fair grader must not
# mistake for slips:
#   memory_per_rank: a dict of what each stage shards, K read as "values of state per
#                   parameter value" from the state tensors shaped like their parameter
#                   -> no check
#   reduce_scatter: each step posts an isend and an irecv into a list of requests and waits
#                   on the list; the rank's running sums live in a flat clone -> no check
#   all_gather: the same list of requests, receiving straight into the output's chunks
#                   -> no check
#   ShardedOptimizer: subclasses torch.optim.Optimizer and overrides add_param_group;
#                   assigns WHOLE parameters to ranks (greedy, the least loaded rank takes the
#                   next parameter, in the order given) instead of cutting a flat vector;
#                   the inner optimizer holds this rank's parameters only; step() steps them
#                   and then dist.broadcast()s every parameter from its owner; zero_grad is
#                   the base class's -> no check

# %% [markdown]
# # Optimizer state sharding
# Memory accounting for DDP and the three ZeRO stages, the two halves of a ring
# all-reduce with point-to-point calls, and a sharded optimizer that gives each rank whole
# parameters and broadcasts them after the step.

# %%
from typing import Any, Type

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from d2l import torch as d2l


# %%
# what each stage splits across the data-parallel ranks: (params, grads, optimizer state)
SHARDED = {
    0: (False, False, False),  # DDP: everything replicated
    1: (False, False, True),   # ZeRO-1: optimizer state
    2: (False, True, True),    # ZeRO-2: + gradients
    3: (True, True, True),     # ZeRO-3 / FSDP: + parameters
}


def memory_per_rank(model, optimizer, stage, world_size):
    if stage not in SHARDED:
        raise ValueError(f"unknown ZeRO stage {stage}; expected one of {sorted(SHARDED)} "
                         "(0 = DDP)")
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in trainable)
    bytes_per_value = trainable[0].element_size()

    # K = values of optimizer state per parameter value (0 SGD, 1 momentum, 2 Adam);
    # Adam's `step` is a 0-d tensor, so anything not shaped like the param is skipped
    n_state = 0
    for p in trainable:
        for v in optimizer.state[p].values():
            if isinstance(v, torch.Tensor) and v.shape == p.shape:
                n_state += v.numel()
    k = n_state // n_params

    shard = (n_params + world_size - 1) // world_size  # rank 0 gets the biggest chunk
    shard_params, shard_grads, shard_state = SHARDED[stage]
    values = ((shard if shard_params else n_params)
              + (shard if shard_grads else n_params)
              + k * (shard if shard_state else n_params))
    return values * bytes_per_value


# %%
def show_memory():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():  # fake grads: one step so that AdamW allocates its state
        p.grad = torch.randn_like(p)
    opt.step()
    for stage in range(4):
        row = [memory_per_rank(model, opt, stage, ws) / 2**20 for ws in (1, 2, 4, 8)]
        print(f"stage {stage}: " + "  ".join(f"{mb:6.2f} MiB" for mb in row))

show_memory()


# %%
def reduce_scatter(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    buf = tensor.detach().flatten().clone()
    chunks = list(buf.tensor_split(world_size))
    send_to, recv_from = (rank + 1) % world_size, (rank - 1) % world_size

    for i in range(world_size - 1):
        send_chunk = chunks[(rank - i - 1) % world_size]
        acc_chunk = chunks[(rank - i - 2) % world_size]
        incoming = torch.empty_like(acc_chunk)
        reqs = []
        if send_chunk.numel() > 0:
            reqs.append(dist.isend(send_chunk, dst=send_to))
        if incoming.numel() > 0:
            reqs.append(dist.irecv(incoming, src=recv_from))
        for req in reqs:
            req.wait()
        acc_chunk += incoming

    return chunks[rank]


# %%
def all_gather(shard, numel):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = torch.empty(numel, dtype=shard.dtype, device=shard.device)
    chunks = list(out.tensor_split(world_size))
    chunks[rank].copy_(shard.flatten())
    send_to, recv_from = (rank + 1) % world_size, (rank - 1) % world_size

    for i in range(world_size - 1):
        send_chunk = chunks[(rank - i) % world_size]
        recv_chunk = chunks[(rank - i - 1) % world_size]
        reqs = []
        if send_chunk.numel() > 0:
            reqs.append(dist.isend(send_chunk, dst=send_to))
        if recv_chunk.numel() > 0:
            reqs.append(dist.irecv(recv_chunk, src=recv_from))
        for req in reqs:
            req.wait()

    return out


# %%
def test_halves():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x = torch.arange(7.0) + 10 * rank
    mine = reduce_scatter(x)
    expected = x.clone()
    dist.all_reduce(expected)
    assert torch.allclose(mine, expected.tensor_split(world_size)[rank])
    full = all_gather(mine, x.numel())
    assert torch.allclose(full, expected)
    print(f"rank {rank}: shard {mine.tolist()} -> {full.tolist()}")
    return full

d2l.launch(test_halves, nprocs=3)


# %%
class ShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls: Type[Optimizer], **kwargs: Any):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.optimizer_cls = optimizer_cls
        self.kwargs = kwargs
        self.param_to_rank = {}
        self.rank_numel = [0] * self.world_size
        self.optimizer = None  # built lazily by add_param_group (called by super().__init__)
        super().__init__(params, defaults=kwargs)

    def add_param_group(self, param_group: dict[str, Any]):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            if not p.requires_grad:
                continue
            # greedy: the least loaded rank takes the next parameter
            owner = min(range(self.world_size), key=lambda r: self.rank_numel[r])
            self.param_to_rank[p] = owner
            self.rank_numel[owner] += p.numel()
            if owner == self.rank:
                mine.append(p)
        if not mine:
            return
        local_group = {k: v for k, v in group.items() if k != "params"}
        local_group["params"] = mine
        if self.optimizer is None:
            self.optimizer = self.optimizer_cls([local_group], **self.kwargs)
        else:
            self.optimizer.add_param_group(local_group)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if self.optimizer is not None:
            loss = self.optimizer.step(closure, **kwargs)
        for p, owner in self.param_to_rank.items():
            dist.broadcast(p.data, src=owner)
        return loss


# %%
def check_sharded(optimizer_cls=torch.optim.AdamW, steps=5, **kwargs):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5))
    ref = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5))
    ref.load_state_dict(model.state_dict())
    opt = ShardedOptimizer(model.parameters(), optimizer_cls, **kwargs)
    ref_opt = optimizer_cls(ref.parameters(), **kwargs)
    gen = torch.Generator().manual_seed(42)
    for _ in range(steps):
        x, y = torch.randn(16, 10, generator=gen), torch.randn(16, 5, generator=gen)
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        xs, ys = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        nn.functional.mse_loss(model(xs), ys).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
    n_state = sum(t.numel() for s in opt.optimizer.state.values() for t in s.values()
                  if torch.is_tensor(t) and t.dim() > 0)
    print(f"rank {rank}: owns {opt.rank_numel[rank]} params, {n_state} state values, "
          f"max diff vs. unsharded {diff:.2e}")
    return diff

d2l.launch(check_sharded, kwargs={"lr": 1e-2}, nprocs=2)
d2l.launch(check_sharded, args=(torch.optim.SGD,), kwargs={"lr": 0.1, "momentum": 0.9}, nprocs=4)
