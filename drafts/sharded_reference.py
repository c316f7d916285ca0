"""Draft reference implementations for issue 47's sharded notebook (not graded, not shipped):
the ring's two halves by point-to-point calls, a flat-shard ZeRO-1 and ZeRO-2 optimizer, and
the memory formulas, checked against one process on gloo ranks.

    .venv/bin/python drafts/sharded_reference.py        (2, 3 and 4 ranks)

Next session: move these into solutions/multigpu/sharded.ipynb as solution cells, with
checks, hidden checks and a mistake catalogue (see the closing note of the stop that added
this file). Counted at rank 0's sends in one step of the toy model (58 values): DDP, ZeRO-1
and ZeRO-2 send the same (232, 308 and 344 bytes at 2, 3 and 4 ranks), ZeRO-3 1.5 times as
much (348, 464, 516: a second all-gather in the backward), as the ZeRO paper says; stages 1
and 2 differ in memory alone (stage 2 frees each gradient bucket once sent, which this
draft, building the gradient whole, does not show). On torch 2.14 gloo
has reduce_scatter_tensor and all_gather_into_tensor, refuses an all_gather of uneven
sizes, and runs ZeroRedundancyOptimizer and fully_shard on the CPU."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

# ---- 1. where the memory goes ------------------------------------------------------------


def memory_per_rank(
    model: nn.Module,
    optimizer_state_per_param: int,
    stage: int,
    world: int,
    bytes_per_value: int = 4,
) -> int:
    """Bytes rank 0 holds for parameters, gradients and optimizer state (stage 0 is DDP;
    1, 2, 3 ZeRO's stages). Shards split the flat vector as `tensor_split` does: rank 0's is
    the largest, ceil(P / world)."""
    total = sum(p.numel() for p in model.parameters())
    shard = -(-total // world)
    params = shard if stage >= 3 else total
    grads = shard if stage >= 2 else total
    state = (shard if stage >= 1 else total) * optimizer_state_per_param
    return (params + grads + state) * bytes_per_value


# ---- 2. the ring's two halves --------------------------------------------------------------

SENT = [0]  # bytes this rank has sent, for the communication figures


def send(tensor: torch.Tensor, to: int):
    SENT[0] += tensor.numel() * tensor.element_size()
    return dist.isend(tensor, to)


def reduce_scatter(flat: torch.Tensor) -> torch.Tensor:
    """Return this rank's chunk (`tensor_split` into world chunks) of the sum of every rank's
    `flat`, by point-to-point calls: N-1 steps, each sending one chunk to the next rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in flat.tensor_split(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_i, recv = (rank - step - 1) % world, (rank - step - 2) % world
        incoming = torch.empty_like(chunks[recv])
        requests = [send(chunks[send_i], right), dist.irecv(incoming, left)]
        for r in requests:
            r.wait()
        chunks[recv] += incoming
    return chunks[rank]


def all_gather(shard: torch.Tensor, total: int) -> torch.Tensor:
    """Return the flat vector of `total` values whose `tensor_split` chunks the ranks hold
    (this rank's is `shard`), by point-to-point calls around the ring."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.empty(total, dtype=shard.dtype).tensor_split(world))
    chunks[rank].copy_(shard)
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_i, recv = (rank - step) % world, (rank - step - 1) % world
        requests = [send(chunks[send_i].contiguous(), right), dist.irecv(chunks[recv], left)]
        for r in requests:
            r.wait()
    return torch.cat(chunks)


# ---- 3 and 4. sharded optimizers -------------------------------------------------------------


class ShardedOptimizer:
    """ZeRO-1 (stage 1) or ZeRO-2 (stage 2) over the model's flat parameter vector: each rank
    keeps `optimizer_cls`'s state for its chunk alone and steps that chunk, on its chunk of
    the reduce-scattered gradient; the updated chunks then reach every rank (all_gather)."""

    def __init__(self, params, optimizer_cls, stage: int = 1, **kwargs) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.stage = stage
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.total = flat.numel()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.shard = nn.Parameter(flat.tensor_split(world)[rank].clone())
        self.inner = optimizer_cls([self.shard], **kwargs)

    def step(self) -> None:
        world = dist.get_world_size()
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        # Both stages reduce-scatter: stage 1 keeps the whole gradient (here `grads`, built
        # whole), stage 2 would free each bucket once it is sent (not shown at this size).
        self.shard.grad = reduce_scatter(grads) / world
        self.inner.step()
        flat = all_gather(self.shard.detach(), self.total)
        offset = 0
        for p in self.params:
            p.data.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class ShardedLayer(nn.Module):
    """ZeRO-3, FSDP's idea, one layer at a time: the layer's parameters live as this rank's
    chunk of their flat vector alone. The whole vector is gathered just before the layer
    computes, forward and again backward (where the forward is computed anew), and freed
    after; the full gradient is reduce-scattered, so each rank keeps its chunk's."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        named = [(n, p) for n, p in layer.named_parameters()]
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
        self.total = flat.numel()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.shard = nn.Parameter(flat.tensor_split(world)[rank].clone())
        for n in self.names:  # the layer keeps its code, not its parameters (a flat layer)
            delattr(layer, n)
        self.layer = [layer]  # a list: not a submodule, so its parameters are not ours
        self.peak_full = 0  # the most values of this layer held whole at once

    def full(self) -> dict[str, torch.Tensor]:
        flat = all_gather(self.shard.detach(), self.total)
        self.peak_full = max(self.peak_full, flat.numel())
        views, offset = {}, 0
        for n, shape in zip(self.names, self.shapes, strict=True):
            size = shape.numel()
            views[n] = flat[offset : offset + size].view(shape)
            offset += size
        return views

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GatherCompute.apply(x, self.shard, self)


class _GatherCompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, owner):
        ctx.owner = owner
        ctx.save_for_backward(x)
        params = owner.full()
        with torch.no_grad():
            out = torch.func.functional_call(owner.layer[0], params, (x,))
        del params  # freed: only this rank's chunk stays
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        owner = ctx.owner
        params = {n: v.requires_grad_() for n, v in owner.full().items()}
        x_in = x.detach().requires_grad_(x.requires_grad)
        with torch.enable_grad():
            out = torch.func.functional_call(owner.layer[0], params, (x_in,))
        inputs = [x_in, *params.values()] if x.requires_grad else list(params.values())
        grads = torch.autograd.grad(out, inputs, grad_out)
        param_grads = grads[1:] if x.requires_grad else grads
        flat = torch.cat([g.reshape(-1) for g in param_grads])
        shard_grad = reduce_scatter(flat) / dist.get_world_size()
        return (grads[0] if x.requires_grad else None), shard_grad, None


def shard_model(net: nn.Sequential) -> nn.Sequential:
    """Return `net` with each layer that has parameters wrapped in a ShardedLayer."""
    return nn.Sequential(
        *[ShardedLayer(m) if any(True for _ in m.parameters()) else m for m in net]
    )


# ---- checked against one process -----------------------------------------------------------


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3))


def batches(steps: int, size: int = 12):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(size, 7, generator=g), torch.randint(0, 3, (size,), generator=g))
        for _ in range(steps)
    ]


def one_process(optimizer_cls, steps, **kwargs):
    net = model()
    opt = optimizer_cls(net.parameters(), **kwargs)
    for X, y in batches(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def bytes_per_step(world: int) -> tuple[int, ...]:
    """Bytes this rank sends in one training step of each strategy, counted at its sends."""
    rank = dist.get_rank()
    X, y = batches(1)[0]
    Xs, ys = X.tensor_split(world)[rank], y.tensor_split(world)[rank]
    found = []
    net = model()  # DDP: a ring all-reduce of the whole gradient, as its two halves
    nn.functional.cross_entropy(net(Xs), ys).backward()
    SENT[0] = 0
    grads = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
    all_gather(reduce_scatter(grads), grads.numel())
    found.append(SENT[0])
    for stage in (1, 2):
        net = model()
        opt = ShardedOptimizer(net.parameters(), torch.optim.SGD, stage=stage, lr=0.1)
        nn.functional.cross_entropy(net(Xs), ys).backward()
        SENT[0] = 0
        opt.step()
        found.append(SENT[0])
    net3 = shard_model(model())
    SENT[0] = 0
    nn.functional.cross_entropy(net3(Xs), ys).backward()
    found.append(SENT[0])
    return tuple(found)


def body(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    found = {}
    for length in (1, world - 1, world, 10, 17):
        x = torch.arange(length, dtype=torch.float64) * (rank + 1)
        want = torch.arange(length, dtype=torch.float64) * sum(range(1, world + 1))
        mine = reduce_scatter(x)
        found[f"reduce_scatter {length}"] = torch.equal(mine, want.tensor_split(world)[rank])
        found[f"all_gather {length}"] = torch.equal(all_gather(mine, length), want)
    for name, cls, kwargs in (
        ("sgd+momentum", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
        ("adam", torch.optim.Adam, {"lr": 0.01}),
    ):
        for stage in (1, 2):
            net = model()
            opt = ShardedOptimizer(net.parameters(), cls, stage=stage, **kwargs)
            for X, y in batches(5):
                Xs, ys = X.tensor_split(world)[rank], y.tensor_split(world)[rank]
                opt.zero_grad()
                # each rank's loss is its shard's share of the global mean
                loss = nn.functional.cross_entropy(net(Xs), ys, reduction="sum") * world / len(X)
                loss.backward()
                opt.step()
            ref = one_process(cls, 5, **kwargs)
            pairs = zip([p.detach() for p in net.parameters()], ref, strict=True)
            found[f"ZeRO-{stage} {name}"] = max((p - r).abs().max().item() for p, r in pairs)
        net3 = shard_model(model())
        opt3 = cls([m.shard for m in net3 if isinstance(m, ShardedLayer)], **kwargs)
        for X, y in batches(5):
            Xs, ys = X.tensor_split(world)[rank], y.tensor_split(world)[rank]
            opt3.zero_grad()
            loss = nn.functional.cross_entropy(net3(Xs), ys, reduction="sum") * world / len(X)
            loss.backward()
            opt3.step()
        whole = [t for m in net3 if isinstance(m, ShardedLayer) for t in m.full().values()]
        found[f"ZeRO-3 {name}"] = max(
            (w - r).abs().max().item() for w, r in zip(whole, ref, strict=True)
        )
        found[f"ZeRO-3 {name}: values held, shards vs whole model"] = (
            sum(m.shard.numel() for m in net3 if isinstance(m, ShardedLayer)),
            sum(r.numel() for r in ref),
        )
    found["bytes per step (DDP, ZeRO-1, ZeRO-2, ZeRO-3)"] = bytes_per_step(world)
    if rank == 0:
        results.update(found)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    print(
        "ResNet-18 stand-in formula check:",
        [memory_per_rank(nn.Linear(10, 10), 2, s, 4) for s in range(4)],
    )
    for world in (2, 3, 4):
        with mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(body, args=(world, 29600 + world, results), nprocs=world)
            print(world, "ranks:", dict(results))
    sys.exit(0)
