# Slips, and the one check each must cost:
#   get_params: `p.data.to(device)` and no clone, the `.data` habit of these notes; on the
#               device a parameter already lives on, its "copy" shares its memory
#               -> copies_are_independent_of_the_originals
# Notes (not slips): the notes' own `sgd` (param.data -= lr * param.grad / batch_size), with
#   the gradients zeroed before backward (`param.grad.data.zero_()`, as in train_ch3), not after
#   the step; accuracy by a hand-written `evaluate_accuracy(data_iter, net, device)`; timing
#   with time.time() and torch.cuda.synchronize(); a line printed per epoch as well as the plot.

# %% [markdown]
# # 多GPU训练：从零开始实现
# 读书笔记。第一版 PyTorch 改写的 8.4 节只讲了 `nn.DataParallel`，这里按实验的要求，先把数据并行
# 自己从头写一遍：每块GPU上放一份 LeNet 的参数，把小批量切开分给各块GPU，各自算梯度，梯度加起来
# 以后每块GPU用同样的梯度更新自己那一份参数。

# %%
%matplotlib inline
import time
import torch
from torch import nn
import torch.nn.functional as F
from d2l import torch as d2l

print(torch.__version__)

# %% [markdown]
# ## 1. 设备
# 常见写法是 `device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')`，这里要能指定第几块GPU。

# %%
def try_gpu(i=0):
    """如果存在第i块GPU就返回它，否则返回CPU"""
    if torch.cuda.is_available() and torch.cuda.device_count() >= i + 1:
        return torch.device('cuda:%d' % i)
    return torch.device('cpu')

# %%
def try_all_gpus():
    """返回所有的GPU；一块都没有的话返回[cpu]，这样后面取 devices[0] 总能取到"""
    devices = [torch.device('cuda:%d' % i) for i in range(torch.cuda.device_count())]
    if len(devices) == 0:
        devices = [torch.device('cpu')]
    return devices

# %%
device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
print('GPU个数:', torch.cuda.device_count(), ' 默认设备:', device)
print(try_gpu(), try_gpu(10), try_all_gpus())
# 实验环境给的设备（GPU不够两块时是模拟设备）
print(d2l.try_all_gpus())

# %% [markdown]
# ## 2. 模型：用参数列表写的 LeNet

# %%
# 初始化模型参数：权重 ~ N(0, 0.01^2)，偏差为0
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
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    H = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), kernel_size=2, stride=2)   # (B, 20, 13, 13)
    H = F.avg_pool2d(F.relu(F.conv2d(H, W2, b2)), kernel_size=2, stride=2)   # (B, 50, 4, 4)
    H = H.view(H.shape[0], -1)                                                # (B, 800)
    H = F.relu(torch.mm(H, W3) + b3)
    return torch.mm(H, W4) + b4

# 交叉熵损失，不求平均（每块GPU上再自己求和）
loss = nn.CrossEntropyLoss(reduction='none')

# %% [markdown]
# ## 3. 把参数复制到指定设备上

# %%
def get_params(params, device):
    new_params = [p.data.to(device) for p in params]  # 用 .data 拿到不带计算历史的张量
    for p in new_params:
        p.requires_grad_()
    return new_params

# %%
new_params = get_params(params, d2l.try_gpu(0))
print('b1 weight:', new_params[1])
print('b1 grad:', new_params[1].grad)

# %% [markdown]
# ## 4. allreduce：把所有设备上的张量加起来，再把和写回每个设备

# %%
def allreduce(data):
    total = data[0].data
    for t in data[1:]:
        total.add_(t.data.to(total.device))   # 先把别的设备上的值搬过来加到 data[0] 上
    for t in data[1:]:
        t.data.copy_(total.to(t.device))      # 再原地写回，调用者手里的张量也就变了

# %%
data = [torch.ones((1, 2), device=d2l.try_gpu(i)) * (i + 1) for i in range(2)]
print('allreduce之前：\n', data[0], '\n', data[1])
allreduce(data)
print('allreduce之后：\n', data[0], '\n', data[1])

# %% [markdown]
# ## 5. 把一个小批量切给多块GPU

# %%
data = torch.arange(20).reshape(4, 5)
devices = d2l.lab_devices(2)
print('input :', data)
print('load into', devices)
print('output:', d2l.scatter(data, devices))

# %%
def split_batch(X, y, devices):
    """把X和y按第0维切成len(devices)份，第i份放到devices[i]上"""
    assert X.shape[0] == y.shape[0], 'X和y的样本数不一样: %d vs %d' % (X.shape[0], y.shape[0])
    n = len(devices)
    X_shards = [x.to(d) for x, d in zip(X.chunk(n), devices)]
    y_shards = [t.to(d) for t, d in zip(y.chunk(n), devices)]
    return X_shards, y_shards

# %%
X_shards, y_shards = split_batch(torch.arange(20).reshape(4, 5), torch.arange(4), devices)
print(X_shards, y_shards)

# %% [markdown]
# ## 6. 在多块GPU上训练一个小批量

# %%
def sgd(params, lr, batch_size):
    # 小批量随机梯度下降；改的是 param.data，这样不会被 autograd 记录
    for param in params:
        param.data -= lr * param.grad / batch_size

# %%
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    # 梯度清零（第一次调用时还没有梯度）
    for W in device_params:
        for param in W:
            if param.grad is not None:
                param.grad.data.zero_()
    # 每块GPU用自己那份参数算自己那部分数据的损失（求和），然后反向传播
    ls = [loss(lenet(X_shard, W), y_shard).sum()
          for X_shard, y_shard, W in zip(X_shards, y_shards, device_params)]
    for l in ls:
        l.backward()
    # 同一个参数在各块GPU上的梯度加起来
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    # 每块GPU各自更新；梯度是整个小批量的和，所以除以整个小批量的大小
    for W in device_params:
        sgd(W, lr, X.shape[0])

# %% [markdown]
# ## 7. 训练

# %%
def evaluate_accuracy(data_iter, net, device=None):
    """net 在 data_iter 上的准确率；net 可以是 nn.Module，也可以是普通的函数"""
    is_module = isinstance(net, nn.Module)
    if device is None and is_module:
        device = list(net.parameters())[0].device  # 没指定 device 就用模型参数所在的设备
    if is_module:
        net.eval()  # 评估模式，关掉 dropout，BN 用移动平均
    acc_sum, n = 0.0, 0
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            acc_sum += (net(X).argmax(dim=1) == y).float().sum().cpu().item()
            n += y.shape[0]
    if is_module:
        net.train()  # 改回训练模式
    return acc_sum / n

# %%
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    # 每块GPU上放一份参数
    device_params = [get_params(params, d) for d in devices]
    print('training on', devices)
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    test_accs, epoch_times = [], []
    for epoch in range(num_epochs):
        start = time.time()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
            torch.cuda.synchronize()  # GPU 是异步的，等它算完再计时
        epoch_times.append(time.time() - start)
        # 用第一块GPU上的那份参数测试
        test_acc = evaluate_accuracy(test_iter, lambda x: lenet(x, device_params[0]), devices[0])
        test_accs.append(test_acc)
        animator.add(epoch + 1, (test_acc,))
        print('epoch %d, test acc %.3f, time %.1f sec' % (epoch + 1, test_acc, epoch_times[-1]))
    print(f'test acc: {test_accs[-1]:.2f}, {sum(epoch_times) / len(epoch_times):.1f} sec/epoch '
          f'on {str(devices)}')
    return test_accs

# %%
train(num_gpus=1, batch_size=256, lr=0.2)

# %%
train(num_gpus=2, batch_size=256, lr=0.2)
