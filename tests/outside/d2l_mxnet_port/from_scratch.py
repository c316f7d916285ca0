# Slips, and the one check each must cost:
#   split_batch: split_and_load asserts the batch divides evenly over the devices, as
#                MXNet's even_split does; the lab wants torch.chunk's sizes (5 rows over 2
#                devices give 3 and 2) -> shard_sizes_follow_torch_chunk

# %% [markdown]
# # Multi-GPU training from scratch
# I learnt this chapter from the first edition (MXNet/Gluon, `d2lzh`), so I port its code to
# PyTorch one line at a time: `ctx` becomes a device, `copyto` and `attach_grad` get small
# stand-ins, and `nd.waitall()` becomes a synchronize.

# %%
%matplotlib inline
import torch
from torch import nn
from torch.nn import functional as F
from d2l import torch as d2l

# %% [markdown]
# ## Contexts (devices)
# MXNet finds out whether a GPU is there by putting a small array on it and catching the
# error. The same trick works in PyTorch: CUDA raises when the device does not exist.

# %%
def try_gpu(i=0):
    """GPU i if an array can be put on it, else the CPU (the first edition's probe)."""
    try:
        ctx = torch.device(f'cuda:{i}')
        _ = torch.zeros((1,), device=ctx)
    except (RuntimeError, AssertionError):  # MXNetError in the original
        ctx = torch.device('cpu')
    return ctx

# %%
def try_all_gpus():
    """Every GPU that takes an array; [cpu] when none does."""
    ctxes = []
    try:
        for i in range(16):  # as in d2lzh: assume no machine has more than 16 GPUs
            ctx = torch.device(f'cuda:{i}')
            _ = torch.tensor([0], device=ctx)
            ctxes.append(ctx)
    except (RuntimeError, AssertionError):
        pass
    if not ctxes:
        ctxes = [torch.device('cpu')]
    return ctxes

# %%
print(try_gpu(), try_all_gpus())
print(d2l.lab_devices(2))

# %% [markdown]
# ## LeNet written with tensors

# %%
scale = 0.01
W1 = torch.randn(20, 1, 3, 3) * scale
b1 = torch.zeros(20)
W2 = torch.randn(50, 20, 5, 5) * scale
b2 = torch.zeros(50)
W3 = torch.randn(800, 128) * scale
b3 = torch.zeros(128)
W4 = torch.randn(128, 10) * scale
b4 = torch.zeros(10)
params = [W1, b1, W2, b2, W3, b3, W4, b4]

def lenet(X, params):
    h1_conv = F.conv2d(X, params[0], params[1])
    h1_activation = F.relu(h1_conv)
    h1 = F.avg_pool2d(h1_activation, kernel_size=2, stride=2)
    h2_conv = F.conv2d(h1, params[2], params[3])
    h2_activation = F.relu(h2_conv)
    h2 = F.avg_pool2d(h2_activation, kernel_size=2, stride=2)
    h2 = h2.flatten(start_dim=1)
    h3_linear = torch.mm(h2, params[4]) + params[5]
    h3 = F.relu(h3_linear)
    y_hat = torch.mm(h3, params[6]) + params[7]
    return y_hat

# Gluon's SoftmaxCrossEntropyLoss gives one loss per example: so does reduction='none'
loss = nn.CrossEntropyLoss(reduction='none')

# %% [markdown]
# ## Copying the parameters: `copyto` and `attach_grad`
# `NDArray.copyto(ctx)` always makes a new array; `copyto(other_array)` writes into
# `other_array`. `tensor.to(device)` is not the same (it hands back the tensor itself when it
# is already there), so I keep a small `copyto` that behaves like MXNet's.

# %%
def copyto(x, target):
    """MXNet's x.copyto(target): into a tensor, in place; onto a device, a fresh copy."""
    if isinstance(target, torch.Tensor):
        with torch.no_grad():
            target.copy_(x)
        return target
    return x.detach().to(target, copy=True)

def get_params(params, device):
    new_params = [copyto(p, device) for p in params]
    for p in new_params:
        p.requires_grad_()  # attach_grad()
    return new_params

# %%
new_params = get_params(params, d2l.try_gpu(0))
print('b1 weight:', new_params[1])
print('b1 grad:', new_params[1].grad)

# %% [markdown]
# ## allreduce
# Add everything into the first array, then copy the total back into the others.

# %%
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        copyto(data[0], data[i])

# %%
data = [torch.ones((1, 2), device=d2l.try_gpu(i)) * (i + 1) for i in range(2)]
print('before allreduce:', data)
allreduce(data)
print('after allreduce:', data)

# %% [markdown]
# ## split_and_load
# The first edition splits a batch with `gluon.utils.split_and_load`, which wants the batch
# to divide evenly over the contexts. Here is the same thing for tensors.

# %%
def split_and_load(data, ctx):
    n, k = data.shape[0], len(ctx)
    assert n % k == 0, f'cannot split {n} examples evenly over {k} devices'
    m = n // k
    return [data[i * m: (i + 1) * m].to(ctx[i]) for i in range(k)]

# %%
batch = torch.arange(24).reshape(6, 4)
ctx = d2l.lab_devices(2)
splitted = split_and_load(batch, ctx)
print('input: ', batch)
print('load into', ctx)
print('output:', splitted)

# %%
def split_batch(X, y, devices):
    """Split X and y with split_and_load: shard i of each goes to devices[i]."""
    assert X.shape[0] == y.shape[0], \
        f'X has {X.shape[0]} examples but y has {y.shape[0]} labels'
    return split_and_load(X, devices), split_and_load(y, devices)

# %% [markdown]
# ## Training on one minibatch

# %%
def train_batch(X, y, device_params, devices, lr):
    gpu_Xs, gpu_ys = split_batch(X, y, devices)
    # a loss vector on every device
    ls = [loss(lenet(gpu_X, gpu_W), gpu_y)
          for gpu_X, gpu_y, gpu_W in zip(gpu_Xs, gpu_ys, device_params)]
    for l in ls:  # backward on every device; a head gradient of ones sums the losses
        l.backward(torch.ones_like(l))
    # add the gradients of all devices up and broadcast them back
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    for param in device_params:  # every device updates its copy
        d2l.sgd(param, lr, X.shape[0])  # the size of the whole minibatch

# %% [markdown]
# ## Training

# %%
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    print('running on:', devices)
    # copy the model parameters to every device
    gpu_params = [get_params(params, c) for c in devices]
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
    test_accs = []
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            # one minibatch, trained on every device
            train_batch(X, y, gpu_params, devices, lr)
            d2l.synchronize(devices)  # nd.waitall()
        train_time = timer.stop()

        def net(x):  # evaluate on the first device
            return lenet(x, gpu_params[0])

        test_acc = d2l.evaluate_accuracy_gpu(net, test_iter, devices[0])
        test_accs.append(test_acc)
        animator.add(epoch + 1, (test_acc,))
        print('epoch %d, time %.1f sec, test acc %.2f' % (epoch + 1, train_time, test_acc))
    print(f'test acc: {test_accs[-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    return test_accs

# %%
train(num_gpus=1, batch_size=256, lr=0.2)

# %%
train(num_gpus=2, batch_size=256, lr=0.2)
