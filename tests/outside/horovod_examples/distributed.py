# Slips, and the one check each must cost:
#   evaluate_accuracy_distributed: the accuracy of each rank's own shard, all-reduced and
#                   averaged, as the Horovod examples' metric_average does: right only when
#                   every shard is the same size -> every_rank_returns_the_accuracy_of_the_whole_set
# Habits that are not slips (-> no check): hvd-style size()/rank() helpers; the ring's chunk
#   sizes computed by hand (the first n % size chunks one larger) and cut with torch.split;
#   gradients averaged with ReduceOp.AVG as hvd.allreduce averages; "tensor fusion" with a
#   threshold in bytes, filled in the order backward makes gradients ready, one dtype per
#   buffer; a DistributedSampler for the test set too.

# %% [markdown]
# # Distributed data parallelism, Horovod style
# I learnt this with Horovod: `hvd.size()`, `hvd.rank()`, an averaging allreduce, and a ring
# whose two phases the Horovod paper draws as a reduce-scatter then an allgather. Here the
# same habits on `torch.distributed` and the lab's launcher.

# %%
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from d2l import torch as d2l


# %%
def size():
    return dist.get_world_size()


def rank():
    return dist.get_rank()


def hello():
    t = torch.ones((1, 2)) * (rank() + 1)
    dist.all_reduce(t)
    print(f'hvd.rank() = {rank()}, hvd.size() = {size()}, allreduced: {t}')
    return t


d2l.launch(hello, nprocs=2)


# %% [markdown]
# ## Ring-allreduce
# N - 1 steps of reduce-scatter, each worker passing a chunk to its right-hand neighbour and
# adding what comes from its left, then N - 1 steps of allgather passing the finished chunks.

# %%
def ring_allreduce(tensor):
    n, me = size(), rank()
    if n == 1:
        return tensor
    flat = tensor.reshape(-1).clone()
    counts = [flat.numel() // n + (1 if i < flat.numel() % n else 0) for i in range(n)]
    segments = list(torch.split(flat, counts))
    send_to, recv_from = (me + 1) % n, (me - 1) % n

    def pass_along(outgoing, incoming):
        requests = []
        if outgoing.numel():
            requests.append(dist.isend(outgoing.contiguous(), send_to))
        if incoming.numel():
            requests.append(dist.irecv(incoming, recv_from))
        for request in requests:
            request.wait()

    # reduce-scatter
    for i in range(n - 1):
        send_idx, recv_idx = (me - i) % n, (me - i - 1) % n
        received = torch.empty_like(segments[recv_idx])
        pass_along(segments[send_idx], received)
        segments[recv_idx] += received
    # allgather
    for i in range(n - 1):
        send_idx, recv_idx = (me - i + 1) % n, (me - i) % n
        pass_along(segments[send_idx], segments[recv_idx])
    tensor.copy_(flat.view_as(tensor))
    return tensor


# %%
def ring_demo():
    t = torch.arange(7.0) + 10 * rank()
    ring_allreduce(t)
    print(t)
    return t


d2l.launch(ring_demo, nprocs=3)


# %% [markdown]
# ## Averaging gradients
# `hvd.allreduce` averages by default; `ReduceOp.AVG` is the same on torch.distributed.

# %%
def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


# %% [markdown]
# ## Tensor fusion
# Horovod fuses small tensors into one buffer up to HOROVOD_FUSION_THRESHOLD bytes, taking
# them in the order they become ready: backward finishes the last layer first.

# %%
def average_gradients_bucketed(model, bucket_mb=25):
    fusion_threshold = bucket_mb * 1024 * 1024  # bytes
    ready = [p.grad for p in reversed(list(model.parameters())) if p.grad is not None]
    fusion_buffers, pending, pending_bytes = [], [], 0
    for grad in ready:
        nbytes = grad.element_size() * grad.numel()
        if pending and (pending_bytes + nbytes > fusion_threshold or grad.dtype != pending[0].dtype):
            fusion_buffers.append(pending)
            pending, pending_bytes = [], 0
        pending.append(grad)
        pending_bytes += nbytes
    if pending:
        fusion_buffers.append(pending)
    for tensors in fusion_buffers:
        fused = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(fused, op=dist.ReduceOp.AVG)
        for t, part in zip(tensors, fused.split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))


# %% [markdown]
# ## Test accuracy over all workers
# The examples' `metric_average`: every worker computes its metric and the allreduce
# averages it.

# %%
def metric_average(val, name, device):
    tensor = torch.tensor(val, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
    return tensor.item()


def evaluate_accuracy_distributed(net, test_iter, device):
    net.eval()
    test_accuracy, seen = 0.0, 0
    with torch.no_grad():
        for data, target in test_iter:
            data, target = data.to(device), target.to(device)
            pred = net(data).argmax(dim=1)
            test_accuracy += (pred == target).float().sum().item()
            seen += len(target)
    test_accuracy /= max(seen, 1)
    return metric_average(test_accuracy, 'avg_accuracy', device)


# %% [markdown]
# ## Training
# Partition both sets with a DistributedSampler, set the sampler's epoch, and let DDP play the
# part of `hvd.DistributedOptimizer` and `broadcast_parameters`.

# %%
def train_ddp(net, num_epochs, batch_size, lr, data=None, device=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set, test_set = data if data is not None else d2l.fashion_mnist_datasets()
    device = device if device is not None else d2l.local_device()

    def init_weights(m):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, std=0.01)

    net.apply(init_weights)
    net.to(device)
    model = DDP(net, device_ids=[device] if device.type == 'cuda' else None)
    train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank)
    train_loader = DataLoader(train_set, batch_size=batch_size // world, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False)
    test_loader = DataLoader(test_set, batch_size=batch_size, sampler=test_sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss()
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        timer.start()
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = criterion(model(data), target)
            loss.backward()
            optimizer.step()
        timer.stop()
        history.append(evaluate_accuracy_distributed(net, test_loader, device))
        if rank == 0:
            print(f'Train Epoch: {epoch + 1}\tLoss: {loss.item():.4f}\tTest acc: {history[-1]:.3f}')
    if rank == 0:
        print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch on {world} processes')
    return history


# %%
def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5), nn.BatchNorm2d(6), nn.Sigmoid(), nn.AvgPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5), nn.BatchNorm2d(16), nn.Sigmoid(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(256, 120), nn.BatchNorm1d(120), nn.Sigmoid(),
        nn.Linear(120, 84), nn.BatchNorm1d(84), nn.Sigmoid(), nn.Linear(84, 10))


history = d2l.launch(train_ddp, args=(lenet(), 10, 256, 1.0),
                     kwargs={'data': d2l.fashion_mnist_datasets(source='sample')}, nprocs=2).result
