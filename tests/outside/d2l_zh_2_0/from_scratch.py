# Slips, and the one check each must cost:
#   split_batch: a bare assert, no message   -> rejects_mismatched_lengths_with_a_message
#   train: returns nothing, as in the book    -> returns_the_accuracy_history

# %% [markdown]
# # 多GPU训练（从零开始）
# 课堂笔记：按书上的顺序把数据并行写一遍。

# %%
%matplotlib inline
import torch
from torch import nn
from torch.nn import functional as F
from d2l import torch as d2l

# %% [markdown]
# ## 设备

# %%
def try_gpu(i=0):
    """有第i块GPU就用它，否则用CPU"""
    if torch.cuda.device_count() > i:
        return torch.device(f'cuda:{i}')
    return torch.device('cpu')

# %%
def try_all_gpus():
    """所有GPU；一块都没有时返回[cpu]"""
    gpus = [torch.device(f'cuda:{k}') for k in range(torch.cuda.device_count())]
    if len(gpus) == 0:
        return [torch.device('cpu')]
    return gpus

# %%
print('GPU数量：', torch.cuda.device_count())
x = torch.ones(2, 3, device=d2l.try_gpu())
print(x)

# %% [markdown]
# ## LeNet 参数

# %%
# 两个卷积层、两个全连接层：权重 N(0, 0.01²)，偏置为0
shapes = [(20, 1, 3, 3), (50, 20, 5, 5), (800, 128), (128, 10)]
params = []
for shape in shapes:
    params.append(torch.randn(size=shape) * 0.01)
    params.append(torch.zeros(shape[0] if len(shape) == 4 else shape[1]))

def lenet(X, params):
    out = F.relu(F.conv2d(input=X, weight=params[0], bias=params[1]))
    out = F.avg_pool2d(input=out, kernel_size=(2, 2), stride=(2, 2))
    out = F.relu(F.conv2d(input=out, weight=params[2], bias=params[3]))
    out = F.avg_pool2d(input=out, kernel_size=(2, 2), stride=(2, 2))
    out = out.reshape(out.shape[0], -1)
    out = F.relu(torch.mm(out, params[4]) + params[5])
    return torch.mm(out, params[6]) + params[7]

loss = nn.CrossEntropyLoss(reduction='none')

# %% [markdown]
# ## 把参数复制到设备上
# 注意：.to() 在同一个设备上不会复制，所以先 clone。

# %%
def get_params(params, device):
    copies = []
    for p in params:
        q = p.detach().clone().to(device)
        q.requires_grad_()
        copies.append(q)
    return copies

new_params = get_params(params, d2l.try_gpu(0))
print('b1 权重:', new_params[1])
print('b1 梯度:', new_params[1].grad)

# %% [markdown]
# ## allreduce：各设备上的梯度求和再广播

# %%
def allreduce(data):
    # 先把其余设备上的值加到 data[0] 上
    for t in data[1:]:
        data[0][:] += t.to(data[0].device)
    # 再把总和写回每个设备（原地写，调用者手里的张量也跟着变）
    for t in data[1:]:
        t[:] = data[0].to(t.device)

data = [torch.ones((1, 2), device=d2l.try_gpu(i)) * (i + 1) for i in range(2)]
print('allreduce之前：\n', data[0], '\n', data[1])
allreduce(data)
print('allreduce之后：\n', data[0], '\n', data[1])

# %% [markdown]
# ## 拆分小批量

# %%
def split_batch(X, y, devices):
    """把X和y按行切开，第i块放到devices[i]上"""
    assert len(X) == len(y)
    X_parts = nn.parallel.scatter(X, devices)
    y_parts = nn.parallel.scatter(y, devices)
    return X_parts, y_parts

# %% [markdown]
# ## 一个小批量的训练

# %%
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    # 每块GPU上各自算损失（求和，不求平均）
    losses = [loss(lenet(X_s, W_s), y_s).sum()
              for X_s, y_s, W_s in zip(X_shards, y_shards, device_params)]
    for l in losses:
        l.backward()
    # 梯度相加后广播到每块GPU
    with torch.no_grad():
        for k in range(len(device_params[0])):
            allreduce([device_params[c][k].grad for c in range(len(devices))])
    # 每块GPU各自更新，除以整个小批量的大小
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])

# %% [markdown]
# ## 训练

# %%
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    # 复制参数到每块GPU
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
        # 在第一块GPU上评估
        acc = d2l.evaluate_accuracy_gpu(lambda x: lenet(x, device_params[0]), test_iter, devices[0])
        animator.add(epoch + 1, (acc,))
    print(f'测试精度：{animator.Y[0][-1]:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}')

# %%
train(num_gpus=2, batch_size=256, lr=0.2)
