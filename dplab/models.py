"""The two networks of the chapter: LeNet as a function of a parameter list, and `Residual`."""

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def lenet_params(scale: float = 0.01, seed: int | None = None) -> list[Tensor]:
    """Return LeNet's eight parameters, weights drawn from N(0, scale^2) and zero biases.

    The tensors do not require grad: each device gets its own trainable copy later.
    """
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    shapes = [((20, 1, 3, 3), 20), ((50, 20, 5, 5), 50), ((800, 128), 128), ((128, 10), 10)]
    params = []
    for weight_shape, bias_size in shapes:
        params.append(torch.randn(size=weight_shape, generator=gen) * scale)
        params.append(torch.zeros(bias_size))
    return params


def lenet(X: Tensor, params: list[Tensor]) -> Tensor:
    """Run LeNet on a batch `X` of 1x28x28 images with the parameters `params`."""
    w1, b1, w2, b2, w3, b3, w4, b4 = params
    h1 = F.avg_pool2d(F.relu(F.conv2d(input=X, weight=w1, bias=b1)), kernel_size=2, stride=2)
    h2 = F.avg_pool2d(F.relu(F.conv2d(input=h1, weight=w2, bias=b2)), kernel_size=2, stride=2)
    h2 = h2.reshape(h2.shape[0], -1)
    h3 = F.relu(torch.mm(h2, w3) + b3)
    return torch.mm(h3, w4) + b4


class Residual(nn.Module):
    """A residual block: two 3x3 convolutions, with a 1x1 convolution on the shortcut
    when the number of channels or the stride changes."""

    def __init__(
        self, input_channels: int, num_channels: int, use_1x1conv: bool = False, strides: int = 1
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(input_channels, num_channels, 3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, 3, padding=1)
        self.conv3 = (
            nn.Conv2d(input_channels, num_channels, 1, stride=strides) if use_1x1conv else None
        )
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X: Tensor) -> Tensor:
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return F.relu(Y + X)
