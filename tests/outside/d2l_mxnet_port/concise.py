# Slips, and the one check each must cost: none. (Ported from the first edition's Gluon
# code: its own Residual with deferred input channels, `net.initialize(init.Normal(0.01))`
# as an init function, per-epoch evaluation and timing with a line printed each epoch.)

# %% [markdown]
# # Multi-GPU training, the concise way
# The first edition trains a ResNet-18 with Gluon, `split_and_load` and one `Trainer`. The lab
# asks for `nn.DataParallel` instead, so that part is PyTorch's; the rest I port from Gluon.

# %%
import torch
from torch import nn
from torch.nn import functional as F
from d2l import torch as d2l

# %% [markdown]
# ## The network
# Gluon's `Residual(num_channels, use_1x1conv, strides)` never names its input channels: they
# are found at the first forward pass (deferred initialisation). PyTorch's lazy convolutions do
# the same, so my block uses them where the input is read.

# %%
class Residual(nn.Module):
    def __init__(self, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.LazyConv2d(num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.LazyConv2d(num_channels, kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        return F.relu(Y + X)

# %%
def resnet18(num_classes, in_channels=1):
    def resnet_block(num_channels, num_residuals, first_block=False):
        blk = nn.Sequential()
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(num_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(num_channels))
        return blk

    # a small kernel, stride and padding, and no max-pooling layer
    net = nn.Sequential(nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
                        nn.BatchNorm2d(64), nn.ReLU())
    net.add_module('resnet_block1', resnet_block(64, 2, first_block=True))
    net.add_module('resnet_block2', resnet_block(128, 2))
    net.add_module('resnet_block3', resnet_block(256, 2))
    net.add_module('resnet_block4', resnet_block(512, 2))
    net.add_module('global_avg_pool', nn.AdaptiveAvgPool2d((1, 1)))
    # Gluon's Dense flattens its input by itself; nn.Linear does not
    net.add_module('fc', nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net

# %%
net = resnet18(10)
# as in the book, a first batch of 4 random images fixes the deferred shapes
x = torch.rand(4, 1, 28, 28)
print(net(x).shape)
print(sum(p.numel() for p in net.parameters()), 'parameters')
devices = d2l.try_all_gpus()
print(devices)

# %% [markdown]
# ## Training
# `net.initialize(init=init.Normal(sigma=0.01), ctx=ctx)` draws the weights and places the
# network; in PyTorch that is an init function over the layers, then `.to(...)`.

# %%
def normal_init(m, sigma=0.01):
    """init.Normal(sigma) for the weights of dense and convolutional layers."""
    if type(m) in [nn.Linear, nn.Conv2d]:
        nn.init.normal_(m.weight, mean=0.0, std=sigma)

def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    print('running on:', devices)
    net.apply(normal_init)
    net.to(devices[0])
    net = nn.DataParallel(net, device_ids=devices)
    trainer = torch.optim.SGD(net.parameters(), lr=lr)
    loss = nn.CrossEntropyLoss()
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer, test_accs = d2l.Timer(), []
    for epoch in range(num_epochs):
        net.train()
        timer.start()
        for X, y in train_iter:
            X, y = X.to(devices[0]), y.to(devices[0])
            trainer.zero_grad()
            l = loss(net(X), y)
            l.backward()
            trainer.step()
        d2l.synchronize(devices)  # nd.waitall()
        train_time = timer.stop()
        test_acc = d2l.evaluate_accuracy_gpu(net, test_iter)
        test_accs.append(test_acc)
        animator.add(epoch + 1, (test_acc,))
        print('epoch %d, time %.1f sec, test acc %.2f' % (epoch + 1, train_time, test_acc))
    print(f'test acc: {test_accs[-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    return test_accs

# %%
train(net, num_gpus=2, batch_size=512, lr=0.2)
