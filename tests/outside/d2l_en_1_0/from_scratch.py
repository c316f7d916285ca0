# Slips, and the one check each must cost:
#   try_all_gpus: an empty list without GPUs, as d2l 1.0's -> gives_the_cpu_when_there_is_no_gpu

# %% [markdown]
# # Data parallelism from scratch
# My notes on the multi-GPU chapter, worked through with the d2l 1.0 helpers.

# %%
%matplotlib inline
import torch
from torch import nn
from torch.nn import functional as F
from d2l import torch as d2l

# %% [markdown]
# ## Devices
# `d2l.num_gpus()`, `d2l.gpu(i)` and `d2l.cpu()` are the 1.0 helpers.

# %%
def try_gpu(i=0):
    """GPU i when the machine has it, else the CPU."""
    if d2l.num_gpus() >= i + 1:
        return d2l.gpu(i)
    return d2l.cpu()

# %%
def try_all_gpus():
    """Every GPU there is."""
    return [d2l.gpu(i) for i in range(d2l.num_gpus())]

# %%
print(d2l.num_gpus(), d2l.cpu(), d2l.gpu(0))
Y = torch.rand(2, 3, device=d2l.gpu(1))
print(Y)

# %% [markdown]
# ## LeNet as a list of tensors

# %%
def init_lenet(scale=0.01):
    weights = [torch.randn(20, 1, 3, 3), torch.randn(50, 20, 5, 5),
               torch.randn(800, 128), torch.randn(128, 10)]
    biases = [torch.zeros(20), torch.zeros(50), torch.zeros(128), torch.zeros(10)]
    out = []
    for w, b in zip(weights, biases):
        out += [w * scale, b]
    return out

params = init_lenet()

def lenet(X, params):
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    H = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), kernel_size=2, stride=2)
    H = F.avg_pool2d(F.relu(F.conv2d(H, W2, b2)), kernel_size=2, stride=2)
    H = F.relu(H.reshape(H.shape[0], -1) @ W3 + b3)
    return H @ W4 + b4

loss = nn.CrossEntropyLoss(reduction='none')

# %% [markdown]
# ## Parameters on a device

# %%
def get_params(params, device):
    new_params = [p.clone().detach().to(device) for p in params]
    for p in new_params:
        p.requires_grad_()
    return new_params

new_params = get_params(params, d2l.gpu(0))
print('b1 weight:', new_params[1])
print('b1 grad:', new_params[1].grad)

# %% [markdown]
# ## Allreduce

# %%
def allreduce(data):
    root = data[0]
    for other in data[1:]:
        root += other.to(root.device)
    for other in data[1:]:
        other.copy_(root)

data = [torch.ones((1, 2), device=d2l.gpu(i)) * (i + 1) for i in range(2)]
print('before allreduce:\n', data[0], '\n', data[1])
allreduce(data)
print('after allreduce:\n', data[0], '\n', data[1])

# %% [markdown]
# ## Splitting a minibatch

# %%
data = torch.arange(20).reshape(4, 5)
devices = [d2l.gpu(0), d2l.gpu(1)]
split = nn.parallel.scatter(data, devices)
print('input :', data)
print('load into', devices)
print('output:', split)

# %%
def split_batch(X, y, devices):
    """Split X and y over the devices."""
    assert X.shape[0] == y.shape[0], f'{X.shape[0]} examples, {y.shape[0]} labels'
    return nn.parallel.scatter(X, devices), nn.parallel.scatter(y, devices)

# %% [markdown]
# ## One minibatch on every GPU

# %%
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    # loss on each GPU, summed over its shard
    for X_shard, y_shard, W in zip(X_shards, y_shards, device_params):
        loss(lenet(X_shard, W), y_shard).sum().backward()
    # add up the gradients across the GPUs, parameter by parameter
    with torch.no_grad():
        for grads in zip(*[[p.grad for p in W] for W in device_params]):
            allreduce(list(grads))
    # every GPU updates its own copy, dividing by the full batch size
    for W in device_params:
        d2l.sgd(W, lr, X.shape[0])

# %% [markdown]
# ## Training

# %%
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    # a copy of the parameters for every GPU
    device_params = [get_params(params, d) for d in devices]
    num_epochs = 10
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
            torch.cuda.synchronize()
        timer.stop()
        # evaluate the copy on GPU 0
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(
            lambda x: lenet(x, device_params[0]), test_iter, devices[0]),))
    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch '
          f'on {str(devices)}')
    return animator.Y[0]

# %%
train(num_gpus=1, batch_size=256, lr=0.2)

# %%
train(num_gpus=2, batch_size=256, lr=0.2)
