# Slips, and the one check each must cost: none. (Written in the habits of the Chinese
# edition's TensorFlow tab: devices listed from the number of physical GPUs, tf.split with
# explicit sizes, gradients taken explicitly as GradientTape does and then assigned,
# assign_add/assign as in-place add_/copy_.)

# %% [markdown]
# # 多GPU训练（从零开始）
# 我学的是书的 TensorFlow 版，这里把同样的思路写成 PyTorch：`tf.GradientTape` 换成
# `torch.autograd.grad`，`tf.split` 换成 `torch.split`。

# %%
%matplotlib inline
import torch
from torch import nn
from torch.nn import functional as F
from d2l import torch as d2l

# %% [markdown]
# ## 设备
# TensorFlow 用 `tf.config.list_physical_devices('GPU')` 数GPU，这里用 `torch.cuda.device_count()`。

# %%
def list_physical_gpus():
    """tf.config.list_physical_devices('GPU') 的对应：每块物理GPU一个名字"""
    return [f'cuda:{i}' for i in range(torch.cuda.device_count())]

def try_gpu(i=0):
    """如果存在，则返回gpu(i)，否则返回cpu()"""
    if len(list_physical_gpus()) >= i + 1:
        return torch.device(f'cuda:{i}')
    return torch.device('cpu')

# %%
def try_all_gpus():
    """返回所有可用的GPU，如果没有GPU，则返回[cpu(),]"""
    num_gpus = len(list_physical_gpus())
    devices = [torch.device(f'cuda:{i}') for i in range(num_gpus)]
    return devices if devices else [torch.device('cpu')]

# %%
print('物理GPU：', list_physical_gpus())
print(try_gpu(), try_gpu(10), try_all_gpus())

# %% [markdown]
# ## LeNet 的参数和模型

# %%
def init_params(scale=0.01):
    """权重 ~ N(0, scale²)，偏置为0（相当于 tf.random.normal 和 tf.zeros）"""
    shapes = [((20, 1, 3, 3), 20), ((50, 20, 5, 5), 50), ((800, 128), 128), ((128, 10), 10)]
    params = []
    for w_shape, b_size in shapes:
        params.append(torch.normal(0.0, scale, size=w_shape))
        params.append(torch.zeros(b_size))
    return params

params = init_params()

def lenet(X, params):
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), kernel_size=2, stride=2)
    h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), kernel_size=2, stride=2)
    h = torch.reshape(h, (h.shape[0], -1))
    h = F.relu(torch.matmul(h, W3) + b3)
    return torch.matmul(h, W4) + b4

# 每个样本一个损失（不用 Keras 默认的按批量求平均）
loss = nn.CrossEntropyLoss(reduction='none')

# %% [markdown]
# ## 把参数放到设备上
# TensorFlow 里是在 `with tf.device(...)` 下面建 `tf.Variable`，每次都是新变量。
# PyTorch 的 `.to()` 在同一设备上不复制，所以先 `detach().clone()`。

# %%
def get_params(params, device):
    variables = []
    for p in params:
        v = p.detach().clone().to(device)
        v.requires_grad_(True)  # 相当于 trainable 的 tf.Variable
        variables.append(v)
    return variables

# %%
new_params = get_params(params, d2l.try_gpu(0))
print('b1 权重:', new_params[1])
print('b1 梯度:', new_params[1].grad)

# %% [markdown]
# ## allreduce
# `assign_add` 对应 `add_`，`assign` 对应 `copy_`：都是原地修改。

# %%
def allreduce(data):
    total = data[0]
    for t in data[1:]:
        total.add_(t.to(total.device))  # assign_add
    for t in data[1:]:
        t.copy_(total.to(t.device))  # assign

# %%
data = [torch.ones((1, 2), device=d2l.try_gpu(i)) * (i + 1) for i in range(2)]
print('allreduce之前：\n', data[0], '\n', data[1])
allreduce(data)
print('allreduce之后：\n', data[0], '\n', data[1])

# %% [markdown]
# ## 拆分小批量
# `tf.split(x, num_or_size_splits=k)` 要求能整除，所以我总是传各段的大小：
# 和 `torch.chunk` 一样，每段 ceil(n/k) 行，最后一段是剩下的。

# %%
def shard_sizes(n, k):
    step = max(1, (n + k - 1) // k)
    return [min(step, n - start) for start in range(0, n, step)]

def split_batch(X, y, devices):
    """把X和y切成每个设备一段"""
    if X.shape[0] != y.shape[0]:
        raise ValueError(f'样本数和标签数不一致：X {X.shape[0]} 行，y {y.shape[0]} 个')
    sizes = shard_sizes(X.shape[0], len(devices))
    X_shards = [x.to(d) for x, d in zip(torch.split(X, sizes), devices)]
    y_shards = [t.to(d) for t, d in zip(torch.split(y, sizes), devices)]
    return X_shards, y_shards

# %%
data = torch.arange(20).reshape(4, 5)
devices = d2l.lab_devices(2)
X_shards, _ = split_batch(data, torch.arange(4), devices)
print('input :', data)
print('load into', devices)
print('output:', X_shards)
print('7行分到3个设备：', shard_sizes(7, 3))

# %% [markdown]
# ## 一个小批量
# 每个设备上像 `tape.gradient(l, params)` 那样显式求出梯度，allreduce 以后
# 再把梯度交给各自的参数，用 `d2l.sgd` 更新。

# %%
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    device_grads = []
    for X_shard, y_shard, W in zip(X_shards, y_shards, device_params):
        l = loss(lenet(X_shard, W), y_shard).sum()  # 求和，不求平均
        device_grads.append(list(torch.autograd.grad(l, W)))
    # 同一个参数在各设备上的梯度相加，再发回每个设备
    for i in range(len(device_params[0])):
        allreduce([grads[i] for grads in device_grads])
    # 把梯度交给参数，按整个小批量的大小更新
    for W, grads in zip(device_params, device_grads):
        for p, g in zip(W, grads):
            p.grad = g
        d2l.sgd(W, lr, X.shape[0])

# %% [markdown]
# ## 训练

# %%
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    # 每个设备一份参数
    device_params = [get_params(params, d) for d in devices]
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
    history = []
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
        d2l.synchronize(devices)  # 等设备算完再停表
        timer.stop()
        # 用第一个设备上的参数评估
        test_acc = d2l.evaluate_accuracy_gpu(
            lambda x: lenet(x, device_params[0]), test_iter, devices[0])
        history.append(test_acc)
        animator.add(epoch + 1, (test_acc,))
    print(f'测试精度：{history[-1]:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}')
    return history

# %%
train(num_gpus=2, batch_size=256, lr=0.2)
