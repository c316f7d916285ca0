"""The two networks of the chapter: LeNet as a function of a parameter list, and `Residual`."""

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from labtext import N_, _


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
    when the number of channels or the stride changes.

    It takes either edition's arguments:
        Residual(input_channels, num_channels, use_1x1conv=False, strides=1)   (d2l 2.0)
        Residual(num_channels, use_1x1conv=False, strides=1)                   (d2l 1.0)
    In the second form the input channels are not given, so, as in that edition, the
    convolutions that read the input learn their size at the first forward pass (lazy
    layers): run the network once before counting its parameters or copying it to devices.
    """

    def __init__(self, *args: int | bool, **kwargs: int | bool) -> None:
        super().__init__()
        input_channels, num_channels, use_1x1conv, strides = _residual_arguments(args, kwargs)

        def reading_input(kernel_size: int, **options: int) -> nn.Module:
            if input_channels is None:
                return nn.LazyConv2d(num_channels, kernel_size, **options)
            return nn.Conv2d(input_channels, num_channels, kernel_size, **options)

        self.conv1 = reading_input(3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, 3, padding=1)
        self.conv3 = reading_input(1, stride=strides) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X: Tensor) -> Tensor:
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return F.relu(Y + X)


RESIDUAL_FORMS = N_(
    "Residual(input_channels, num_channels, use_1x1conv=False, strides=1) (d2l 2.0) or "
    "Residual(num_channels, use_1x1conv=False, strides=1) (d2l 1.0)"
)


def _residual_arguments(args: tuple, kwargs: dict) -> tuple[int | None, int, bool, int]:
    """Sort Residual's arguments into (input_channels or None, num_channels, use_1x1conv,
    strides), whichever edition's form they follow."""

    def wrong(message: str, **values: object) -> TypeError:
        return TypeError(_(message).format(forms=_(RESIDUAL_FORMS), **values))

    unknown = set(kwargs) - {"input_channels", "num_channels", "use_1x1conv", "strides"}
    if unknown:
        raise wrong(
            N_("Residual got unexpected arguments {names}; it takes {forms}"), names=sorted(unknown)
        )
    rest = list(args)
    counts = []  # the leading channel counts: whole numbers, not True or False
    while rest and len(counts) < 2 and isinstance(rest[0], int) and not isinstance(rest[0], bool):
        counts.append(rest.pop(0))
    if len(rest) > 2:
        raise wrong(N_("Residual got too many arguments {args}; it takes {forms}"), args=args)
    options = dict(kwargs)
    for key, value in zip(("use_1x1conv", "strides"), rest, strict=False):
        if key in options:
            raise wrong(N_("Residual got {key} twice; it takes {forms}"), key=key)
        options[key] = value
    if len(counts) == 2:  # Residual(64, 128, ...): the 2.0 form
        if "input_channels" in options or "num_channels" in options:
            raise wrong(N_("Residual got the channels twice; it takes {forms}"))
        input_channels, num_channels = counts
    elif len(counts) == 1 and "num_channels" in options:  # Residual(64, num_channels=128)
        input_channels, num_channels = counts[0], options["num_channels"]
    elif len(counts) == 1:  # Residual(128, ...): the 1.0 form
        input_channels, num_channels = options.get("input_channels"), counts[0]
    elif "num_channels" in options:
        input_channels, num_channels = options.get("input_channels"), options["num_channels"]
    else:
        raise wrong(N_("Residual needs the number of channels; it takes {forms}"))
    return (
        input_channels,
        int(num_channels),
        bool(options.get("use_1x1conv", False)),
        int(options.get("strides", 1)),
    )
