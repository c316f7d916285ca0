# Slips, and the one check each must cost:
#   train: the network is never moved to devices[0], as in the book: nn.DataParallel refuses
#          the first minibatch of a network left on the CPU
#          -> moves_the_net_to_the_first_device
#   train: returns nothing, as in the book -> returns_the_accuracy_history

# %% [markdown]
# # Multiple GPUs, the concise way
# A ResNet-18 for 28x28 images, trained with `nn.DataParallel` (d2l 1.0).

# %%
import torch
from torch import nn
from d2l import torch as d2l

# %% [markdown]
# ## The network
# d2l 1.0's `Residual(num_channels, use_1x1conv, strides)` finds its input channels at
# the first forward pass.

# %%
def resnet18(num_classes, in_channels=1):
    """ResNet-18 with a small stem and no max-pooling."""
    def resnet_block(num_channels, num_residuals, first_block=False):
        layers = []
        for i in range(num_residuals):
            downsample = i == 0 and not first_block
            layers.append(d2l.Residual(num_channels, use_1x1conv=downsample,
                                       strides=2 if downsample else 1))
        return nn.Sequential(*layers)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64), nn.ReLU())
    for k, channels in enumerate([64, 128, 256, 512], start=1):
        net.add_module(f'resnet_block{k}', resnet_block(channels, 2, first_block=(k == 1)))
    net.add_module('global_avg_pool', nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module('fc', nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net

# %%
net = resnet18(10)
net(torch.zeros(1, 1, 28, 28))  # lazy layers learn their shapes here
print(sum(p.numel() for p in net.parameters()))
devices = d2l.try_all_gpus()

# %% [markdown]
# ## Training

# %%
def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    def init_weights(module):
        if type(module) in [nn.Linear, nn.Conv2d]:
            nn.init.normal_(module.weight, std=0.01)
    net.apply(init_weights)
    # the model on several GPUs
    net = nn.DataParallel(net, device_ids=devices)
    trainer = torch.optim.SGD(net.parameters(), lr)
    loss = nn.CrossEntropyLoss()
    timer, num_epochs = d2l.Timer(), 10
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    for epoch in range(num_epochs):
        net.train()
        timer.start()
        for X, y in train_iter:
            trainer.zero_grad()
            X, y = X.to(devices[0]), y.to(devices[0])
            loss(net(X), y).backward()
            trainer.step()
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(net, test_iter),))
    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch '
          f'on {str(devices)}')

# %%
train(net, num_gpus=2, batch_size=512, lr=0.2)
