# Slips, and the one check each must cost:
#   train: the network is never moved to devices[0], as in the book: nn.DataParallel refuses
#          the first minibatch of a network left on the CPU
#          -> moves_the_net_to_the_first_device
#   train: returns nothing, as in the book -> returns_the_accuracy_history

# %% [markdown]
# # 多GPU的简洁实现
# 用 nn.DataParallel 训练一个改过的 ResNet-18。

# %%
import torch
from torch import nn
from d2l import torch as d2l

# %% [markdown]
# ## 网络：开头换成 3x3 卷积，去掉最大池化层

# %%
def resnet18(num_classes, in_channels=1):
    """稍加修改的ResNet-18"""
    def stage(in_c, out_c, n_blocks, first=False):
        blocks = []
        for k in range(n_blocks):
            if k == 0 and not first:
                blocks.append(d2l.Residual(in_c, out_c, use_1x1conv=True, strides=2))
            else:
                blocks.append(d2l.Residual(out_c, out_c))
        return nn.Sequential(*blocks)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU())
    net.add_module('resnet_block1', stage(64, 64, 2, first=True))
    net.add_module('resnet_block2', stage(64, 128, 2))
    net.add_module('resnet_block3', stage(128, 256, 2))
    net.add_module('resnet_block4', stage(256, 512, 2))
    net.add_module('global_avg_pool', nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module('fc', nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net

# %%
net = resnet18(10)
devices = d2l.try_all_gpus()
print(devices)

# %% [markdown]
# ## 训练

# %%
def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    def init_weights(m):
        if type(m) in [nn.Linear, nn.Conv2d]:
            nn.init.normal_(m.weight, std=0.01)
    net.apply(init_weights)
    # 在多个GPU上放置模型
    net = nn.DataParallel(net, device_ids=devices)
    optimizer = torch.optim.SGD(net.parameters(), lr)
    loss = nn.CrossEntropyLoss()
    timer, num_epochs = d2l.Timer(), 10
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    for epoch in range(num_epochs):
        net.train()
        timer.start()
        for X, y in train_iter:
            optimizer.zero_grad()
            X, y = X.to(devices[0]), y.to(devices[0])
            l = loss(net(X), y)
            l.backward()
            optimizer.step()
        torch.cuda.synchronize()
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(net, test_iter),))
    print(f'测试精度：{animator.Y[0][-1]:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}')

# %%
train(net, num_gpus=1, batch_size=256, lr=0.1)

# %%
train(net, num_gpus=2, batch_size=512, lr=0.2)
