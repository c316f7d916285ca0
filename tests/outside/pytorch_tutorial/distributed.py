# Slips, and the one check each must cost:
#   ring_allreduce: the whole tensor goes round the ring N - 1 times, as in PyTorch's
#                   tutorial on distributed applications, not chunks of 1/N of it
#                   -> each_rank_sends_two_n_minus_one_chunks
#   average_gradients: every parameter is reduced, with no test for a missing gradient
#                   -> skips_frozen_parameters
#   average_gradients_bucketed: buckets filled in forward order, as older apex code did
#                   -> buckets_start_from_the_last_parameter
#   evaluate_accuracy_distributed: the caller is trusted to have called net.eval()
#                   -> evaluates_in_eval_mode

# %% [markdown]
# # Distributed training, the way PyTorch's tutorials write it
# `size` for the world size, `param.grad.data`, a ring of whole tensors, DDP with a
# DistributedSampler for both sets.

# %%
import torch
import torch.distributed as dist
from torch import nn, optim
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from d2l import torch as d2l


# %%
def hello():
    rank = dist.get_rank()
    t = torch.ones(1) * rank
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    print('Rank', rank, 'has data', t[0])

d2l.launch(hello, nprocs=2)


# %%
def ring_allreduce(tensor):
    rank = dist.get_rank()
    size = dist.get_world_size()
    send_buff = tensor.clone()
    recv_buff = tensor.clone()
    accum = tensor.clone()
    left = ((rank - 1) + size) % size
    right = (rank + 1) % size
    for i in range(size - 1):
        if i % 2 == 0:
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    tensor[:] = accum[:]
    return tensor


# %%
def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


# %%
def average_gradients_bucketed(model, bucket_mb=25):
    size = float(dist.get_world_size())
    limit = bucket_mb * 1024 * 1024
    buckets, current, current_bytes = [], [], 0
    for param in model.parameters():
        if param.grad is None:
            continue
        grad = param.grad.data
        nbytes = grad.numel() * grad.element_size()
        if current and current_bytes + nbytes > limit:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(grad)
        current_bytes += nbytes
    if current:
        buckets.append(current)
    for bucket in buckets:
        coalesced = _flatten_dense_tensors(bucket)
        dist.all_reduce(coalesced)
        coalesced /= size
        for grad, synced in zip(bucket, _unflatten_dense_tensors(coalesced, bucket)):
            grad.copy_(synced)


# %%
def evaluate_accuracy_distributed(net, test_iter, device):
    correct, total = 0, 0
    with torch.no_grad():
        for X, y in test_iter:
            X, y = X.to(device), y.to(device)
            correct += (net(X).argmax(dim=1) == y).sum().item()
            total += y.numel()
    counts = torch.tensor([correct, total], dtype=torch.float64, device=device)
    dist.barrier()
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


# %%
def train_ddp(net, num_epochs, batch_size, lr, data=None, device=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set, test_set = data if data is not None else d2l.fashion_mnist_datasets()
    device = device if device is not None else d2l.local_device()

    def init_weights(m):
        if type(m) in (nn.Linear, nn.Conv2d):
            nn.init.normal_(m.weight, std=0.01)

    net.apply(init_weights)
    net = net.to(device)
    ddp_model = DDP(net, device_ids=[device.index] if device.type == 'cuda' else None)
    train_sampler = DistributedSampler(train_set)
    test_sampler = DistributedSampler(test_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=batch_size // world, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=batch_size // world, sampler=test_sampler)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=lr)
    timer = d2l.Timer()
    accuracies = []
    for epoch in range(num_epochs):
        train_sampler.set_epoch(epoch)
        ddp_model.train()
        timer.start()
        for inputs, labels in train_loader:
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            loss_fn(ddp_model(inputs), labels).backward()
            optimizer.step()
        timer.stop()
        net.eval()
        accuracies.append(evaluate_accuracy_distributed(net, test_loader, device))
    if rank == 0:
        print(f'test acc: {accuracies[-1]:.2f}, {timer.avg():.1f} sec/epoch on {world} processes')
    return accuracies


# %%
def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5), nn.Sigmoid(), nn.AvgPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.Sigmoid(), nn.Linear(120, 84), nn.Sigmoid(),
        nn.Linear(84, 10))


def run():
    return train_ddp(lenet(), 10, 256, 0.9)


history = d2l.launch(run, nprocs=2).result
