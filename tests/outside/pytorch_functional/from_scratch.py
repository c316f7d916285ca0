# The from-scratch notebook written with PyTorch's functional data-parallel building blocks
# (torch.cuda.comm and nn.parallel), as someone who knows them from the DataParallel source
# writes it: allreduce as comm.reduce_add then comm.broadcast(out=...), the batch split with
# comm.scatter, each replica's loss computed by nn.parallel.parallel_apply on small modules
# and the losses brought together with nn.parallel.gather for one backward pass.
# No slips: it must get full marks (on two GPUs it is correct).

# %% [markdown]
# # Data parallelism from scratch, with torch.cuda.comm

# %%
%matplotlib inline
import torch
import torch.cuda.comm as comm
from torch import nn
from torch.nn import functional as F
from d2l import torch as d2l

# %%
def try_gpu(i=0):
    """GPU i if there is one, else the CPU."""
    return torch.device('cuda', i) if torch.cuda.device_count() > i else torch.device('cpu')

# %%
def try_all_gpus():
    """Every GPU, or the CPU alone."""
    count = torch.cuda.device_count()
    return [torch.device('cuda', i) for i in range(count)] or [torch.device('cpu')]

# %% [markdown]
# ## The model

# %%
scale = 0.01
W1 = torch.randn(size=(20, 1, 3, 3)) * scale
b1 = torch.zeros(20)
W2 = torch.randn(size=(50, 20, 5, 5)) * scale
b2 = torch.zeros(50)
W3 = torch.randn(size=(800, 128)) * scale
b3 = torch.zeros(128)
W4 = torch.randn(size=(128, 10)) * scale
b4 = torch.zeros(10)
params = [W1, b1, W2, b2, W3, b3, W4, b4]

def lenet(X, params):
    h = F.avg_pool2d(F.relu(F.conv2d(X, params[0], params[1])), kernel_size=2, stride=2)
    h = F.avg_pool2d(F.relu(F.conv2d(h, params[2], params[3])), kernel_size=2, stride=2)
    h = F.relu(h.flatten(1) @ params[4] + params[5])
    return h @ params[6] + params[7]

loss = nn.CrossEntropyLoss(reduction='none')

# %%
def get_params(params, device):
    return [p.detach().to(device, copy=True).requires_grad_() for p in params]

# %% [markdown]
# ## Collectives from torch.cuda.comm

# %%
def allreduce(data):
    """Sum on the first tensor's device, then copy the sum into every tensor given."""
    total = comm.reduce_add(data, destination=data[0].get_device())
    comm.broadcast(total, out=list(data))

# %%
def split_batch(X, y, devices):
    if len(X) != len(y):
        raise ValueError(f'{len(X)} examples but {len(y)} labels')
    return comm.scatter(X, devices), comm.scatter(y, devices)

# %%
class ShardLoss(nn.Module):
    """The summed loss of one replica on its shard."""

    def __init__(self, replica):
        super().__init__()
        self.replica = replica

    def forward(self, X, y):
        return loss(lenet(X, self.replica), y).sum().reshape(1)

def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    used = len(X_shards)
    modules = [ShardLoss(replica) for replica in device_params[:used]]
    losses = nn.parallel.parallel_apply(
        modules, list(zip(X_shards, y_shards)), devices=devices[:used])
    nn.parallel.gather(losses, devices[0]).sum().backward()
    with torch.no_grad():
        for copies in zip(*device_params):
            allreduce([p.grad for p in copies])
    for replica in device_params:
        d2l.sgd(replica, lr, X.shape[0])

# %% [markdown]
# ## Training

# %%
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    device_params = [get_params(params, d) for d in devices]
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
    accuracies = []
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
        d2l.synchronize(devices)
        timer.stop()
        acc = d2l.evaluate_accuracy_gpu(lambda x: lenet(x, device_params[0]), test_iter, devices[0])
        accuracies.append(acc)
        animator.add(epoch + 1, (acc,))
    print(f'test acc: {accuracies[-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    return accuracies

# %%
train(num_gpus=2, batch_size=256, lr=0.2)
