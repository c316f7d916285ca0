# Slips, and the one check each must cost: none. (Written in the habits of the Chinese 2.0
# edition's Paddle tab: gradients cleared parameter by parameter as clear_gradient() does,
# paddle.split with explicit section sizes, paddle.no_grad() as torch.no_grad().)

# %% [markdown]
# # 多GPU训练（从零开始）
# 我是照着《动手学深度学习》2.0 的飞桨（Paddle）版学的，这里把它改写成 PyTorch。

# %%
%matplotlib inline
import torch
from torch import nn
from torch.nn import functional as F
from d2l import torch as d2l

# %% [markdown]
# ## 设备
# 飞桨里写 `paddle.CUDAPlace(i)` / `paddle.CPUPlace()`，PyTorch 里就是 `torch.device`。

# %%
def try_gpu(i=0):
    """如果存在第i个GPU就返回它，否则返回CPU"""
    if torch.cuda.device_count() >= i + 1:
        return torch.device(f'cuda:{i}')
    return torch.device('cpu')

# %%
def try_all_gpus():
    """返回所有可用的GPU；没有GPU时返回[cpu]"""
    devices = [torch.device(f'cuda:{i}') for i in range(torch.cuda.device_count())]
    return devices if devices else [torch.device('cpu')]

# %%
print(try_gpu(), try_gpu(10), try_all_gpus())

# %% [markdown]
# ## 模型：LeNet

# %%
# 初始化模型参数
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

# 定义模型
def lenet(X, params):
    h1_conv = F.conv2d(input=X, weight=params[0], bias=params[1])
    h1_activation = F.relu(h1_conv)
    h1 = F.avg_pool2d(input=h1_activation, kernel_size=(2, 2), stride=(2, 2))
    h2_conv = F.conv2d(input=h1, weight=params[2], bias=params[3])
    h2_activation = F.relu(h2_conv)
    h2 = F.avg_pool2d(input=h2_activation, kernel_size=(2, 2), stride=(2, 2))
    h2 = h2.reshape((h2.shape[0], -1))
    h3_linear = torch.mm(h2, params[4]) + params[5]
    h3 = F.relu(h3_linear)
    y_hat = torch.mm(h3, params[6]) + params[7]
    return y_hat

# 交叉熵损失函数，不求平均
loss = nn.CrossEntropyLoss(reduction='none')

# %% [markdown]
# ## 数据同步
# 飞桨的 `paddle.to_tensor(p, place=device)` 总是新建张量；PyTorch 的 `.to()` 在同一设备上
# 会直接返回原张量，所以要先 `clone()`。`stop_gradient = False` 对应 `requires_grad_()`。

# %%
def get_params(params, device):
    new_params = [p.detach().clone().to(device) for p in params]
    for p in new_params:
        p.requires_grad_()  # p.stop_gradient = False
    return new_params

# %%
new_params = get_params(params, d2l.try_gpu(0))
print('b1 权重:', new_params[1])
print('b1 梯度:', new_params[1].grad)

# %%
def allreduce(data):
    # 把其余设备上的数据都加到第一个设备上
    for i in range(1, len(data)):
        data[0] += data[i].to(data[0].device)
    # 再把结果写回各个设备（原地写入，不换成新张量）
    for i in range(1, len(data)):
        data[i].copy_(data[0].to(data[i].device))

# %%
data = [torch.ones((1, 2), device=d2l.try_gpu(i)) * (i + 1) for i in range(2)]
print('allreduce之前：\n', data[0], '\n', data[1])
allreduce(data)
print('allreduce之后：\n', data[0], '\n', data[1])

# %% [markdown]
# ## 数据分发
# `paddle.split(x, num_or_sections, axis=0)` 可以给出每一段的大小。这里按 `torch.chunk` 的
# 规则算出各段大小（每段 ceil(n/k) 行，最后一段拿剩下的），再切开、放到各个设备上。

# %%
def split_sections(n, k):
    """n行分成最多k段时每一段的行数，与torch.chunk相同"""
    size = -(-n // k)  # 向上取整
    sections = [size] * (n // size)
    if n % size:
        sections.append(n % size)
    return sections

def split_batch(X, y, devices):
    """将X和y拆分到多个设备上"""
    assert X.shape[0] == y.shape[0], f'X有{X.shape[0]}个样本，y却有{y.shape[0]}个标签'
    sections = split_sections(X.shape[0], len(devices))
    X_shards = [x.to(d) for x, d in zip(torch.split(X, sections, dim=0), devices)]
    y_shards = [t.to(d) for t, d in zip(torch.split(y, sections, dim=0), devices)]
    return X_shards, y_shards

# %%
data = torch.arange(20).reshape(4, 5)
devices = d2l.lab_devices(2)
split = split_batch(data, torch.arange(4), devices)[0]
print('input :', data)
print('load into', devices)
print('output:', split)
print('5行分到2个设备：', split_sections(5, 2))

# %% [markdown]
# ## 训练

# %%
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    # 先清空上一步留下的梯度（飞桨里的 clear_gradient）
    for device_W in device_params:
        for p in device_W:
            p.grad = None
    # 在每个GPU上分别计算损失
    ls = [loss(lenet(X_shard, device_W), y_shard).sum()
          for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)]
    for l in ls:  # 反向传播在每个GPU上分别执行
        l.backward()
    # 将每个GPU的所有梯度相加，并将其广播到所有GPU
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    # 在每个GPU上分别更新模型参数
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])  # 在这里，我们使用全尺寸的小批量

# %%
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    # 将模型参数复制到num_gpus个GPU
    device_params = [get_params(params, d) for d in devices]
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            # 为单个小批量执行多GPU训练
            train_batch(X, y, device_params, devices, lr)
            d2l.synchronize(devices)
        timer.stop()
        # 在GPU0上评估模型
        with torch.no_grad():
            acc = d2l.evaluate_accuracy_gpu(
                lambda x: lenet(x, device_params[0]), test_iter, devices[0])
        animator.add(epoch + 1, (acc,))
    print(f'测试精度：{animator.Y[0][-1]:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}')
    return animator.Y[0]

# %%
train(num_gpus=2, batch_size=256, lr=0.2)
