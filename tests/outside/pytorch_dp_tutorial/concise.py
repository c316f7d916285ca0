# Slips: none.
# Notes (not slips): the tutorial's order, `model = nn.DataParallel(model, device_ids=devices)`
#   first and `model.to(devices[0])` after: nn.DataParallel wants the module on device_ids[0]
#   only when forward runs, so a net handed over on the CPU still trains on the given devices.
#   A Trainer in the habits of PyTorch's examples (zero_grad(set_to_none=True), non_blocking
#   copies, model.train() per epoch, its own model.eval() / torch.no_grad() evaluation with
#   the accuracy counted by hand) instead of d2l.evaluate_accuracy_gpu.

# %% [markdown]
# # Data parallelism with `nn.DataParallel`
# Working through the concise multi-GPU section with what I picked up from PyTorch's
# "Optional: Data Parallelism" tutorial: wrap the model, put it on the first device, and let
# `DataParallel` cut every batch into one piece per device.

# %%
%matplotlib inline
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from d2l import torch as d2l

# %% [markdown]
# ## Watching DataParallel split a batch
# A toy model that prints the size of the piece it gets, fed random vectors. Outside the model
# we see the whole batch; inside, each replica sees only its share.

# %%
input_size, output_size = 5, 2
batch_size, data_size = 30, 100

class RandomDataset(Dataset):
    def __init__(self, size, length):
        self.samples = torch.randn(length, size)

    def __getitem__(self, index):
        return self.samples[index]

    def __len__(self):
        return len(self.samples)

class ToyModel(nn.Module):
    def __init__(self, input_size, output_size):
        super().__init__()
        self.fc = nn.Linear(input_size, output_size)

    def forward(self, x):
        out = self.fc(x)
        print(f"\tIn ToyModel: input size {tuple(x.size())}, output size {tuple(out.size())}")
        return out

# %%
devices = d2l.try_all_gpus()
toy = ToyModel(input_size, output_size)
if len(devices) > 1:
    print(f"Let's use {len(devices)} GPUs!")
toy = nn.DataParallel(toy, device_ids=devices)
toy.to(devices[0])

rand_loader = DataLoader(RandomDataset(input_size, data_size), batch_size=batch_size, shuffle=True)
for batch in rand_loader:
    batch = batch.to(devices[0], non_blocking=True)
    out = toy(batch)
    print(f"Outside: input size {tuple(batch.size())}, output size {tuple(out.size())}")

# %% [markdown]
# ## ResNet-18 for 28x28 images
# The book's version: a 3x3 stem without max-pooling, four stages of two residual blocks.

# %%
def resnet18(num_classes, in_channels=1):
    """ResNet-18 with a small stem, for Fashion-MNIST sized images."""
    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blocks = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blocks.append(d2l.Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
            else:
                blocks.append(d2l.Residual(out_channels, out_channels))
        return nn.Sequential(*blocks)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
    )
    stages = [(64, 64), (64, 128), (128, 256), (256, 512)]
    for i, (c_in, c_out) in enumerate(stages, start=1):
        net.add_module(f"resnet_block{i}", resnet_block(c_in, c_out, 2, first_block=(i == 1)))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net

# %%
net = resnet18(10)
print(f"{sum(p.numel() for p in net.parameters()):,} parameters")
print(net(torch.zeros(2, 1, 28, 28)).shape)

# %% [markdown]
# ## A small trainer
# One class holds the model, the data and the optimizer; `run_epoch` trains, `evaluate`
# counts the right answers on the test set.

# %%
class Trainer:
    def __init__(self, model, train_data, test_data, optimizer, loss_fn, device):
        self.model = model
        self.train_data = train_data
        self.test_data = test_data
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.device = device

    def _run_batch(self, inputs, targets):
        self.optimizer.zero_grad(set_to_none=True)
        outputs = self.model(inputs)
        loss = self.loss_fn(outputs, targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def run_epoch(self):
        self.model.train()
        steps = 0
        for inputs, targets in self.train_data:
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            self._run_batch(inputs, targets)
            steps += 1
        return steps

    def evaluate(self):
        self.model.eval()
        correct, total = 0, 0
        with torch.no_grad():
            for inputs, targets in self.test_data:
                inputs = inputs.to(self.device, non_blocking=True)
                targets = targets.to(self.device, non_blocking=True)
                predicted = self.model(inputs).argmax(dim=1)
                correct += (predicted == targets).sum().item()
                total += targets.size(0)
        return correct / total

# %% [markdown]
# ## Training

# %%
def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]

    def init_weights(m):
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, std=0.01)

    net.apply(init_weights)
    if len(devices) > 1:
        print(f"Let's use {len(devices)} GPUs!")
    model = nn.DataParallel(net, device_ids=devices)
    model.to(devices[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trainer = Trainer(model, train_iter, test_iter, optimizer, nn.CrossEntropyLoss(), devices[0])

    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    history, epoch_times = [], []
    for epoch in range(num_epochs):
        start = time.perf_counter()
        steps = trainer.run_epoch()
        torch.cuda.synchronize()
        epoch_times.append(time.perf_counter() - start)
        acc = trainer.evaluate()
        history.append(acc)
        animator.add(epoch + 1, (acc,))
        print(f"Epoch {epoch + 1} | steps {steps} | test acc {acc:.3f}")
    print(f'test acc: {history[-1]:.2f}, {sum(epoch_times) / len(epoch_times):.1f} sec/epoch '
          f'on {str(devices)}')
    return history

# %%
train(net, num_gpus=1, batch_size=256, lr=0.1)

# %%
train(net, num_gpus=2, batch_size=512, lr=0.2)
