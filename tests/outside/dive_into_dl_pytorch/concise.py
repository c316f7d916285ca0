# Slips: none in this notebook (the folder's one slip is get_params, in from_scratch.py).
# Notes (not slips): the notes' own Residual(in_channels, out_channels, use_1x1conv, stride)
#   and their GlobalAvgPool2d / FlattenLayer modules in place of nn.AdaptiveAvgPool2d and
#   nn.Flatten (the same computation, the same 11,175,818 parameters); the net goes to
#   devices[0] before nn.DataParallel (the notes' `net.cuda()` first); no net.train() at the top
#   of each epoch: the hand-written evaluate_accuracy switches back to training mode itself;
#   a line printed per epoch as well as the plot.

# %% [markdown]
# # 多GPU训练：简洁实现（`nn.DataParallel`）
# 读书笔记，对应第一版 PyTorch 改写的 8.4 节：用 `torch.nn.DataParallel` 把一个小批量自动切到多块GPU上。
# 模型换成改过的 ResNet-18（适合 28x28 的 Fashion-MNIST）。

# %%
%matplotlib inline
import time
import torch
from torch import nn
from torch.nn import init
import torch.nn.functional as F
from d2l import torch as d2l

# %% [markdown]
# ## DataParallel 怎么用
# 先把模型放到第一块GPU上（原书是 `net.cuda()`），再用 `DataParallel` 包起来；不指定 `device_ids`
# 时默认用所有GPU。包过以后原来的模型在 `net.module` 里（保存参数时要用 `net.module.state_dict()`）。

# %%
print(torch.cuda.device_count())  # 可用的GPU数量
devices = d2l.try_all_gpus()
print(devices)

# %%
net = nn.Linear(10, 1).to(devices[0])
net = nn.DataParallel(net, device_ids=devices)
print(net)
print(net(torch.rand(8, 10).to(devices[0])).shape)
print(net.module.weight.shape)

# %% [markdown]
# ## 模型：ResNet-18
# 和 5.11 节一样自己写残差块；开头换成 3x3 卷积、去掉最大池化层，不然 28x28 的图一开始就被缩得太小。

# %%
class Residual(nn.Module):
    """残差块：两个3x3卷积；通道数或者步幅变了的时候，捷径上用1x1卷积变形"""
    def __init__(self, in_channels, out_channels, use_1x1conv=False, stride=1):
        super(Residual, self).__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, stride=stride)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        shortcut = X if self.conv3 is None else self.conv3(X)
        return F.relu(Y + shortcut)


class GlobalAvgPool2d(nn.Module):
    # 全局平均池化：池化窗口设成整张特征图的大小
    def __init__(self):
        super(GlobalAvgPool2d, self).__init__()

    def forward(self, x):
        return F.avg_pool2d(x, kernel_size=x.size()[2:])


class FlattenLayer(nn.Module):
    # (batch, C, 1, 1) -> (batch, C)
    def __init__(self):
        super(FlattenLayer, self).__init__()

    def forward(self, x):
        return x.view(x.shape[0], -1)

# %%
def resnet18(num_classes, in_channels=1):
    """改过的 ResNet-18"""
    def resnet_block(in_c, out_c, num_residuals, first_block=False):
        if first_block:
            assert in_c == out_c  # 第一个模块的通道数和输入一样
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(in_c, out_c, use_1x1conv=True, stride=2))  # 高宽减半
            else:
                blk.append(Residual(out_c, out_c))
        return nn.Sequential(*blk)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU())
    channels = [64, 64, 128, 256, 512]
    for k in range(1, 5):
        net.add_module('resnet_block%d' % k,
                       resnet_block(channels[k - 1], channels[k], 2, first_block=(k == 1)))
    net.add_module('global_avg_pool', GlobalAvgPool2d())  # 输出形状 (batch, 512, 1, 1)
    net.add_module('fc', nn.Sequential(FlattenLayer(), nn.Linear(512, num_classes)))
    return net

# %%
net = resnet18(10)
X = torch.rand((1, 1, 28, 28))
for name, layer in net.named_children():
    X = layer(X)
    print(name, ' output shape:\t', X.shape)
print('参数个数:', sum(p.numel() for p in net.parameters()))

# %% [markdown]
# ## 训练

# %%
def evaluate_accuracy(data_iter, net, device=None):
    """net 在 data_iter 上的准确率"""
    if device is None and isinstance(net, nn.Module):
        device = list(net.parameters())[0].device  # 没指定 device 就用模型参数所在的设备
    acc_sum, n = 0.0, 0
    net.eval()  # 评估模式，BN 用移动平均
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            acc_sum += (net(X).argmax(dim=1) == y).float().sum().cpu().item()
            n += y.shape[0]
    net.train()  # 改回训练模式
    return acc_sum / n

# %%
def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    # 卷积层和全连接层的权重初始化为 N(0, 0.01^2)
    def init_weights(m):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            init.normal_(m.weight, mean=0, std=0.01)
    net.apply(init_weights)
    net = net.to(devices[0])                          # 先放到第一块GPU上
    net = nn.DataParallel(net, device_ids=devices)    # 再包一层 DataParallel
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loss = nn.CrossEntropyLoss()
    print('training on', devices)
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    test_accs, epoch_times = [], []
    for epoch in range(num_epochs):
        train_l_sum, train_acc_sum, n, batch_count, start = 0.0, 0.0, 0, 0, time.time()
        for X, y in train_iter:
            X = X.to(devices[0])
            y = y.to(devices[0])
            y_hat = net(X)
            l = loss(y_hat, y)
            optimizer.zero_grad()
            l.backward()
            optimizer.step()
            train_l_sum += l.cpu().item()
            train_acc_sum += (y_hat.argmax(dim=1) == y).sum().cpu().item()
            n += y.shape[0]
            batch_count += 1
        torch.cuda.synchronize()
        epoch_times.append(time.time() - start)
        test_acc = evaluate_accuracy(test_iter, net)
        test_accs.append(test_acc)
        animator.add(epoch + 1, (test_acc,))
        print('epoch %d, loss %.4f, train acc %.3f, test acc %.3f, time %.1f sec'
              % (epoch + 1, train_l_sum / batch_count, train_acc_sum / n, test_acc,
                 epoch_times[-1]))
    print(f'test acc: {test_accs[-1]:.2f}, {sum(epoch_times) / len(epoch_times):.1f} sec/epoch '
          f'on {str(devices)}')
    return test_accs

# %%
train(net, num_gpus=1, batch_size=256, lr=0.1)

# %%
train(net, num_gpus=2, batch_size=512, lr=0.2)
