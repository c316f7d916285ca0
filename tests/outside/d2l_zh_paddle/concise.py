# Slips, and the one check each must cost: none. (Written in the habits of the Chinese 2.0
# edition's Paddle tab: init over the sublayers, gradients cleared parameter by parameter as
# clear_grad() does, the network moved to the first GPU together with its DataParallel
# wrapper.)

# %% [markdown]
# # 多GPU的简洁实现
# 飞桨版用 `paddle.DataParallel`；改成 PyTorch 就是 `nn.DataParallel`。

# %%
import torch
from torch import nn
from d2l import torch as d2l

# %% [markdown]
# ## 简单网络
# 稍加修改的 ResNet-18：开头用 3x3 卷积、步幅1，并去掉最大汇聚层。

# %%
def resnet18(num_classes, in_channels=1):
    """稍加修改的ResNet-18模型"""
    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(d2l.Residual(in_channels, out_channels,
                                        use_1x1conv=True, strides=2))
            else:
                blk.append(d2l.Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    # 该模型使用了更小的卷积核、步长和填充，而且删除了最大汇聚层
    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU())
    net.add_module('resnet_block1', resnet_block(64, 64, 2, first_block=True))
    net.add_module('resnet_block2', resnet_block(64, 128, 2))
    net.add_module('resnet_block3', resnet_block(128, 256, 2))
    net.add_module('resnet_block4', resnet_block(256, 512, 2))
    net.add_module('global_avg_pool', nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module('fc', nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net

# %%
net = resnet18(10)
print('参数个数：', sum(p.numel() for p in net.parameters()))
# 获取GPU列表
devices = d2l.try_all_gpus()
print(devices)

# %% [markdown]
# ## 训练

# %%
def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    # 权重按 N(0, 0.01²) 初始化（飞桨里是 nn.initializer.Normal(mean=0.0, std=0.01)）
    for layer in net.modules():  # net.sublayers()
        if type(layer) in [nn.Linear, nn.Conv2d]:
            nn.init.normal_(layer.weight, mean=0.0, std=0.01)
    # 在多个GPU上设置模型，整个包装放到第一块GPU上
    net = nn.DataParallel(net, device_ids=devices).to(devices[0])
    trainer = torch.optim.SGD(net.parameters(), lr=lr)
    loss = nn.CrossEntropyLoss()
    timer = d2l.Timer()
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    for epoch in range(num_epochs):
        net.train()
        timer.start()
        for X, y in train_iter:
            for p in net.parameters():  # trainer.clear_grad()
                p.grad = None
            X, y = X.to(devices[0]), y.to(devices[0])
            l = loss(net(X), y)
            l.backward()
            trainer.step()
        d2l.synchronize(devices)
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(net, test_iter),))
    print(f'测试精度：{animator.Y[0][-1]:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}')
    return animator.Y[0]

# %%
train(net, num_gpus=2, batch_size=512, lr=0.2)
