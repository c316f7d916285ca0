# Slips, and the check each must cost:
#   memory_per_rank: the state is measured by a helper, `_optimizer_state_bytes`, that sums
#                   element_size() * numel() over every tensor in optimizer.state, Adam's
#                   0-d `step` counters included (4 bytes a tensor); every figure for Adam is
#                   off by those bytes, and the DDP check owns the cause
#                   -> ddp_holds_everything_on_every_rank
# Habits of PyTorch's ZeroRedundancyOptimizer source that a fair grader must not mistake
# for slips:
#   reduce_scatter, all_gather: raw-string docstrings, `handles` of isend/irecv waited on
#                   at the end of each step, private `_ring_neighbours`/`_chunk_index`
#                   helpers -> no check
#   ShardedOptimizer: subclasses torch.optim.Optimizer; `_partition_parameters()` sorts
#                   each group's trainable parameters by size, largest first, and gives each
#                   to the rank with the fewest elements so far (`_get_min_index`), keeping
#                   the group's options; the local optimizer (`self.optim`) is built over this
#                   rank's groups alone; `_build_param_buckets()` makes one flat bucket per
#                   rank and turns the parameters into views of it (`param.data = ...`), so
#                   that `_sync_params()` broadcasts one bucket per rank, asynchronously;
#                   zero_grad is the base class's -> no check

# %% [markdown]
# # ZeRO, written the way `torch.distributed.optim.ZeroRedundancyOptimizer` is written
# Memory accounting from the optimizer's state, reduce-scatter and all-gather from
# point-to-point calls, and stage 1 with a greedy partition of whole parameters.

# %%
from typing import Any, Dict, List, Type

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from d2l import torch as d2l


# %%
def _tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.element_size() * tensor.numel()


def _optimizer_state_bytes(optimizer: Optimizer, params: List[torch.Tensor]) -> int:
    r"""Bytes of optimizer state kept for ``params``."""
    total = 0
    for param in params:
        for value in optimizer.state[param].values():
            if torch.is_tensor(value):
                total += _tensor_bytes(value)
    return total


def memory_per_rank(model, optimizer, stage, world_size):
    r"""
    Bytes of parameters, gradients and optimizer state held by rank 0.

    Arguments:
        stage (int): 0 (DDP), 1 (optimizer state sharded), 2 (+ gradients),
            3 (+ parameters).
        world_size (int): number of data-parallel ranks.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"`stage` must be one of 0 (DDP), 1, 2 or 3, got {stage}")
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    param_bytes = sum(_tensor_bytes(p) for p in params)
    state_bytes = _optimizer_state_bytes(optimizer, params)

    # rank 0's share of a tensor_split of the flat buffer is the largest one
    shard_numel = -(-numel // world_size)
    def share(nbytes: int) -> int:
        return nbytes * shard_numel // numel

    held_params = share(param_bytes) if stage >= 3 else param_bytes
    held_grads = share(param_bytes) if stage >= 2 else param_bytes
    held_state = share(state_bytes) if stage >= 1 else state_bytes
    return held_params + held_grads + held_state


# %%
def _ring_neighbours() -> tuple:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    return (rank + 1) % world_size, (rank - 1) % world_size


def _chunk_index(rank: int, step: int, world_size: int) -> int:
    return (rank - step) % world_size


def reduce_scatter(tensor):
    r"""
    Return this rank's ``tensor_split`` chunk of the sum of ``tensor`` over all ranks.

    Runs ``world_size - 1`` steps around the ring; at step ``s`` each rank sends chunk
    ``rank - s - 1`` to the next rank and adds the previous rank's chunk ``rank - s - 2``
    into its own copy.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dst, src = _ring_neighbours()
    chunks = [chunk.clone() for chunk in tensor.reshape(-1).tensor_split(world_size)]
    for step in range(world_size - 1):
        send_chunk = chunks[_chunk_index(rank, step + 1, world_size)]
        recv_chunk = chunks[_chunk_index(rank, step + 2, world_size)]
        recv_buffer = torch.empty_like(recv_chunk)
        handles = []
        if send_chunk.numel() > 0:
            handles.append(dist.isend(send_chunk, dst))
        if recv_buffer.numel() > 0:
            handles.append(dist.irecv(recv_buffer, src))
        _ = [handle.wait() for handle in handles]
        recv_chunk.add_(recv_buffer)
    return chunks[rank]


def all_gather(shard, numel):
    r"""
    Return the flat tensor of ``numel`` elements whose ``tensor_split`` chunks the ranks
    hold, ``shard`` being this rank's.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dst, src = _ring_neighbours()
    output = shard.new_empty(numel)
    chunks = output.tensor_split(world_size)
    chunks[rank].copy_(shard.reshape(-1))
    for step in range(world_size - 1):
        send_chunk = chunks[_chunk_index(rank, step, world_size)]
        recv_chunk = chunks[_chunk_index(rank, step + 1, world_size)]
        handles = []
        if send_chunk.numel() > 0:
            handles.append(dist.isend(send_chunk, dst))
        if recv_chunk.numel() > 0:
            handles.append(dist.irecv(recv_chunk, src))
        _ = [handle.wait() for handle in handles]
    return output


# %%
def _halves_example():
    rank = dist.get_rank()
    shard = reduce_scatter(torch.arange(7.0) + 10 * rank)
    print(f"rank {rank}: reduced shard {shard.tolist()}")
    return all_gather(shard, 7)

d2l.launch(_halves_example, nprocs=3)


# %%
def _is_trainable(param: torch.Tensor) -> bool:
    return param.requires_grad


class ShardedOptimizer(Optimizer):
    r"""
    Wraps an arbitrary :class:`optim.Optimizer <torch.optim.Optimizer>` and shards its
    states across ranks: each rank updates the parameters it was assigned, then every
    rank's updated parameters are broadcast to the others, bucket by bucket.

    Arguments:
        params: an iterable of :class:`torch.Tensor` s or :class:`dict` s.
        optimizer_cls (type): the class of the local optimizer.
        **kwargs: all trailing arguments are forwarded to the local optimizer.
    """

    def __init__(self, params, optimizer_cls: Type[Optimizer], **kwargs: Any):
        super().__init__(params, kwargs)
        self.global_rank = dist.get_rank()
        self.rank = self.global_rank
        self.world_size = dist.get_world_size()
        self._optim_constructor = optimizer_cls
        self._optim_defaults = kwargs
        self._partition_parameters_cache: List[List[Dict]] = []
        self._param_to_rank_cache: Dict[torch.Tensor, int] = {}

        self.optim = self._optim_constructor(
            self._partition_parameters()[self.rank], **self._optim_defaults
        )
        self._build_param_buckets()

    @staticmethod
    def _get_min_index(values: List[int]) -> int:
        min_index, min_value = -1, None
        for i, value in enumerate(values):
            if min_value is None or value < min_value:
                min_index, min_value = i, value
        return min_index

    def _partition_parameters(self) -> List[List[Dict]]:
        r"""
        Partition the trainable parameters across the ranks, largest first, each to the
        rank holding the fewest elements so far. Returns, per rank, its ``param_groups``.
        """
        if len(self._partition_parameters_cache) == 0:
            self._partition_parameters_cache = [[] for _ in range(self.world_size)]
            sizes = [0] * self.world_size
            for param_group in self.param_groups:
                params_per_rank: List[List[torch.Tensor]] = [[] for _ in range(self.world_size)]
                params_sorted = sorted(
                    filter(_is_trainable, param_group["params"]),
                    key=lambda t: t.numel(),
                    reverse=True,
                )
                for param in params_sorted:
                    rank = self._get_min_index(sizes)
                    params_per_rank[rank].append(param)
                    sizes[rank] += param.numel()
                for rank, params in enumerate(params_per_rank):
                    param_group_rank = {k: v for k, v in param_group.items() if k != "params"}
                    param_group_rank["params"] = params
                    self._partition_parameters_cache[rank].append(param_group_rank)
        return self._partition_parameters_cache

    @property
    def _param_to_rank(self) -> Dict[torch.Tensor, int]:
        if len(self._param_to_rank_cache) == 0:
            for rank, param_groups in enumerate(self._partition_parameters()):
                for param_group in param_groups:
                    for param in param_group["params"]:
                        self._param_to_rank_cache[param] = rank
        return self._param_to_rank_cache

    def _build_param_buckets(self) -> None:
        r"""One flat bucket per rank holding that rank's parameters, which become views of it."""
        self._buckets: List[torch.Tensor] = []
        for param_groups in self._partition_parameters():
            params = [p for group in param_groups for p in group["params"]]
            if not params:
                self._buckets.append(torch.zeros(1))  # dummy bucket
                continue
            bucket = torch.empty(
                sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
            )
            offset = 0
            for param in params:
                offset_next = offset + param.numel()
                bucket[offset:offset_next].copy_(param.data.flatten())
                param.data = bucket[offset:offset_next].view_as(param.data)
                offset = offset_next
            self._buckets.append(bucket)

    def _sync_params(self) -> None:
        r"""Broadcast every rank's bucket of updated parameters from that rank."""
        handles = []
        for rank, bucket in enumerate(self._buckets):
            handles.append(dist.broadcast(tensor=bucket, src=rank, async_op=True))
        _ = [handle.wait() for handle in handles]

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = self.optim.step(closure=closure, **kwargs)
        self._sync_params()
        return loss


# %%
def _compare_with_torch(optimizer_cls=torch.optim.Adam, **defaults):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    rank, world_size = dist.get_rank(), dist.get_world_size()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 10)))
    ours = ShardedOptimizer(models[0].parameters(), optimizer_cls, **defaults)
    theirs = ZeroRedundancyOptimizer(models[1].parameters(), optimizer_cls, **defaults)
    torch.manual_seed(1)
    for _ in range(4):
        x, y = torch.randn(world_size * 8, 20), torch.randint(0, 10, (world_size * 8,))
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        for model, opt in zip(models, (ours, theirs)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            opt.step()
    gap = max((a - b).abs().max().item()
              for a, b in zip(models[0].parameters(), models[1].parameters()))
    owned = [p.numel() for p, r in ours._param_to_rank.items() if r == rank]
    print(f"rank {rank}: owns {owned}, largest gap to ZeroRedundancyOptimizer {gap:.1e}")
    return gap

d2l.launch(_compare_with_torch, kwargs={"lr": 0.01}, nprocs=3)
