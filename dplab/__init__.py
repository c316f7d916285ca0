"""dplab: the small runtime library of the multi-GPU lab.

It has the helpers that the book's `d2l` package gives these two sections, written plainly
so you can read them. Notebooks import it under the book's name: `import dplab as d2l`.
"""

from dplab.data import (
    Batches,
    get_fashion_mnist_labels,
    load_data_fashion_mnist,
    load_data_fashion_mnist_book,
)
from dplab.devices import (
    device_count,
    lab_devices,
    num_gpus,
    scatter,
    synchronize,
    try_all_gpus,
    try_gpu,
)
from dplab.models import Residual, lenet, lenet_params
from dplab.plot import Animator
from dplab.training import Accumulator, Timer, accuracy, evaluate_accuracy_gpu, sgd

__all__ = [
    "Accumulator",
    "Animator",
    "Batches",
    "Residual",
    "Timer",
    "accuracy",
    "device_count",
    "evaluate_accuracy_gpu",
    "get_fashion_mnist_labels",
    "lab_devices",
    "lenet",
    "lenet_params",
    "load_data_fashion_mnist",
    "load_data_fashion_mnist_book",
    "num_gpus",
    "scatter",
    "sgd",
    "synchronize",
    "try_all_gpus",
    "try_gpu",
]
