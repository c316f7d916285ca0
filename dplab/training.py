"""Small training helpers in the book's style: a timer, counters, SGD and accuracy."""

import time
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from dplab.devices import synchronize
from labtext import _


class Timer:
    """Record how long each `start()` ... `stop()` stretch takes."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.start()

    def start(self) -> None:
        """Start (or restart) the clock."""
        self._began = time.perf_counter()

    def stop(self) -> float:
        """Stop the clock, remember the stretch and return it in seconds."""
        self.times.append(time.perf_counter() - self._began)
        return self.times[-1]

    def avg(self) -> float:
        """Return the mean of the recorded stretches."""
        return sum(self.times) / len(self.times)

    def sum(self) -> float:
        """Return the total of the recorded stretches."""
        return sum(self.times)

    def cumsum(self) -> list[float]:
        """Return the running totals of the recorded stretches."""
        totals, running = [], 0.0
        for t in self.times:
            running += t
            totals.append(running)
        return totals


class Accumulator:
    """Keep `n` running sums, added to one row at a time."""

    def __init__(self, n: int) -> None:
        self.data = [0.0] * n

    def add(self, *args: float) -> None:
        """Add one value to each running sum."""
        self.data = [a + float(b) for a, b in zip(self.data, args, strict=True)]

    def reset(self) -> None:
        """Set every sum back to zero."""
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx: int) -> float:
        return self.data[idx]


def sgd(params: list[Tensor], lr: float, batch_size: int) -> None:
    """Take one minibatch SGD step on `params`, then zero their gradients."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def accuracy(y_hat: Tensor, y: Tensor) -> float:
    """Return how many predictions in `y_hat` match the labels `y`."""
    if y_hat.dim() > 1 and y_hat.shape[1] > 1:
        y_hat = y_hat.argmax(dim=1)
    return float((y_hat.type(y.dtype) == y).sum())


def evaluate_accuracy_gpu(
    net: nn.Module | Callable[[Tensor], Tensor],
    data_iter: Iterable[tuple[Tensor, Tensor]],
    device: torch.device | None = None,
) -> float:
    """Return the accuracy of `net` on `data_iter`, computed on `device`.

    A module is put in evaluation mode first, and `device` defaults to where its
    parameters are. A plain function (such as `lambda X: lenet(X, params)`) needs `device`.
    """
    if isinstance(net, nn.Module):
        net.eval()
        if device is None:
            device = next(iter(net.parameters())).device
    if device is None:
        raise ValueError(_("pass the device to evaluate on when `net` is a function, not a module"))
    correct, total = 0.0, 0
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            correct += accuracy(net(X), y)
            total += y.numel()
    synchronize(device)
    return correct / total
