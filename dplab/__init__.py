"""dplab: the small runtime library of the multi-GPU lab, which notebooks import as the book's
`d2l`. It imports torch, torchvision and labtext, and nothing of the grader.

It has the helpers that the book's `d2l` package gives these two sections, in both editions
(2.0's `try_gpu` and 1.0's `gpu`, either form of `Residual`), written plainly so you can read
them, and `launch`, which runs a function in every process of a group (the distributed
notebook). Notebooks import it under the book's name: `import dplab as d2l`, and the grader reads
`from d2l import torch as d2l` the same way.
"""

from dplab.data import (
    Batches,
    fashion_mnist_datasets,
    get_fashion_mnist_labels,
    load_data_fashion_mnist,
    load_data_fashion_mnist_book,
)
from dplab.devices import (
    cpu,
    device_count,
    gpu,
    lab_devices,
    num_gpus,
    scatter,
    synchronize,
    try_all_gpus,
    try_gpu,
    use_stand_ins,
)
from dplab.distributed import (
    Launched,
    LaunchError,
    bus_bandwidth,
    launch,
    local_device,
    time_allreduce,
)
from dplab.models import Residual, lenet, lenet_params
from dplab.plot import Animator
from dplab.training import Accumulator, Timer, accuracy, evaluate_accuracy_gpu, sgd

__all__ = [
    "Accumulator",
    "Animator",
    "Batches",
    "LaunchError",
    "Launched",
    "Residual",
    "Timer",
    "accuracy",
    "bus_bandwidth",
    "cpu",
    "device_count",
    "evaluate_accuracy_gpu",
    "fashion_mnist_datasets",
    "get_fashion_mnist_labels",
    "gpu",
    "lab_devices",
    "launch",
    "lenet",
    "lenet_params",
    "load_data_fashion_mnist",
    "load_data_fashion_mnist_book",
    "local_device",
    "num_gpus",
    "scatter",
    "sgd",
    "synchronize",
    "time_allreduce",
    "try_all_gpus",
    "try_gpu",
    "use_stand_ins",
]


# A notebook that imported pyplot before the lab (each of the lab's does) may plot Chinese
# labels with it: the fonts that have their glyphs are put behind matplotlib's own now.
if "matplotlib.pyplot" in __import__("sys").modules:
    from dplab.plot import chinese_fonts

    chinese_fonts()

# The book saves these into its d2l package; here they are exercises you write yourself.
_EXERCISES = {"split_batch": "split_batch", "resnet18": "resnet18"}


def __getattr__(name: str):
    if name in _EXERCISES:
        raise AttributeError(
            f"the lab's d2l has no {name}: in this lab you write `{name}` yourself (exercise "
            f"{_EXERCISES[name]}), so call your own function, `{name}(...)`, not `d2l.{name}`"
        )
    raise AttributeError(f"module 'dplab' (the lab's d2l) has no attribute {name!r}")
