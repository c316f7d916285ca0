# Slips, and the one check each must cost: none. (Written in the habits of the Chinese
# edition's TensorFlow tab: Keras-style blocks that learn their input channels, built once
# on a dummy input as model.build does, kernel_initializer-style normal weights, gradients
# taken explicitly as GradientTape does and handed to the optimizer as apply_gradients.)

# %% [markdown]
# # 多GPU的简洁实现
# TensorFlow 版用 `tf.distribute.MirroredStrategy`；PyTorch 里对应的是 `nn.DataParallel`。

# %%
import torch
from torch import nn
from d2l import torch as d2l

# %% [markdown]
# ## 网络
# Keras 的层不写输入通道数，第一次调用时才确定。书里 1.0 形式的
# `d2l.Residual(num_channels, use_1x1conv, strides)` 也是这样（惰性卷积），所以像
# `model.build(input_shape)` 一样，建好以后先用一个假输入跑一遍。

# %%
def resnet18(num_classes, in_channels=1):
    """稍加修改的ResNet-18：3x3卷积开头，没有最大汇聚层"""
    def resnet_block(num_channels, num_residuals, first_block=False):
        blk = nn.Sequential()
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(d2l.Residual(num_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(d2l.Residual(num_channels))
        return blk

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU())
    for k, num_channels in enumerate([64, 128, 256, 512], start=1):
        net.add_module(f'resnet_block{k}', resnet_block(num_channels, 2, first_block=(k == 1)))
    net.add_module('global_avg_pool', nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module('fc', nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    # 相当于 net.build((None, 28, 28, in_channels))：在评估模式下跑一次，不改BN的统计量
    net.eval()
    with torch.no_grad():
        net(torch.zeros(1, in_channels, 28, 28))
    net.train()
    return net

# %%
net = resnet18(10)
print('参数个数：', sum(p.numel() for p in net.parameters()))
devices = d2l.try_all_gpus()
print(devices)

# %% [markdown]
# ## 训练
# 梯度像 `tape.gradient(l, net.trainable_variables)` 那样显式求出，再像
# `optimizer.apply_gradients(zip(grads, variables))` 那样交给优化器。

# %%
def apply_gradients(optimizer, grads_and_vars):
    """Keras 的 optimizer.apply_gradients：把梯度放到变量上，然后走一步"""
    for g, v in grads_and_vars:
        v.grad = g
    optimizer.step()

def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    # kernel_initializer=tf.random_normal_initializer(stddev=0.01)
    for layer in net.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(layer.weight, mean=0.0, std=0.01)
    # MirroredStrategy(devices) 的对应：模型先放到第一个设备上，再复制到各个设备
    net = net.to(devices[0])
    net = nn.DataParallel(net, device_ids=devices)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loss = nn.CrossEntropyLoss()
    variables = [p for p in net.parameters() if p.requires_grad]  # trainable_variables
    timer, history = d2l.Timer(), []
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    for epoch in range(num_epochs):
        net.train()  # training=True
        timer.start()
        for X, y in train_iter:
            X, y = X.to(devices[0]), y.to(devices[0])
            l = loss(net(X), y)
            grads = torch.autograd.grad(l, variables)
            apply_gradients(optimizer, zip(grads, variables))
        d2l.synchronize(devices)
        timer.stop()
        test_acc = d2l.evaluate_accuracy_gpu(net, test_iter)
        history.append(test_acc)
        animator.add(epoch + 1, (test_acc,))
    print(f'测试精度：{history[-1]:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}')
    return history

# %%
train(net, num_gpus=2, batch_size=512, lr=0.2)
