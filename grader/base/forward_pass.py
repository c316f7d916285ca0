"""What a network computes, read from one forward pass rather than from its modules.

`recorded_forward(net, x)` runs the network once under a `TorchFunctionMode` and returns the
operations that ran, in order, as plain data: the layers a check reads (convolution, batch
norm, ReLU, pooling, linear), the additions, and every other call that made a tensor, each
with the operations that made its inputs and the parameters it used. `F.relu` and
`nn.ReLU`, a stem nested in an `nn.Sequential` or spread over a block's `forward`, and
torchvision's blocks are then the same network. Global pooling is named by what it computes
(the mean or the maximum over the image), whatever function did it.
"""

from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

NETWORK_INPUT = -1  # the source of a tensor no recorded operation made
ADDITIONS = {"__add__", "__radd__", "__iadd__", "add", "add_"}
RELUS = {"relu", "relu_"}
NAMED_POOLS = {  # a pooling function's name (in its variants) and the layer it is
    "max_pool2d": "MaxPool2d",
    "max_pool2d_with_indices": "MaxPool2d",
    "_max_pool2d": "MaxPool2d",
    "avg_pool2d": "AvgPool2d",
    "adaptive_max_pool2d": "AdaptiveMaxPool2d",
    "adaptive_max_pool2d_with_indices": "AdaptiveMaxPool2d",
    "_adaptive_max_pool2d": "AdaptiveMaxPool2d",
    "adaptive_avg_pool2d": "AdaptiveAvgPool2d",
}
LAYER_KINDS = {"Conv2d", "BatchNorm2d", "ReLU", "Linear", *NAMED_POOLS.values()}


def pair(value: Any) -> list:
    """Return a size given as an int or a tuple as a list of two (a string, as 'same', kept)."""
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, str):
        return [value]
    return [v if v is None else int(v) for v in value] * (2 if len(value) == 1 else 1)


def tensors_in(value: Any) -> list[Tensor]:
    """Return the tensors in a call's arguments, in order, through lists, tuples and dicts."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def argument(args: tuple, kwargs: dict, position: int, name: str, default: Any) -> Any:
    """Return a call's argument by its position or its name."""
    if len(args) > position:
        return args[position]
    return kwargs.get(name, default)


def global_pool(x: Tensor, out: Tensor) -> str | None:
    """Name a pooling of each channel over the whole image (N, C, H, W to N, C or N, C, 1, 1)
    by what it computed: 'AdaptiveAvgPool2d' for the mean, 'AdaptiveMaxPool2d' for the
    maximum, 'GlobalPool' for anything else; None where the call is no such pooling."""
    if x.dim() != 4 or x.shape[2] * x.shape[3] == 1 or not x.is_floating_point():
        return None
    if tuple(out.shape) not in {tuple(x.shape[:2]), (*x.shape[:2], 1, 1)}:
        return None
    got = out.detach().reshape(x.shape[:2]).float()
    plain = x.detach().float()
    if torch.allclose(got, plain.mean(dim=(2, 3)), rtol=1e-4, atol=1e-5):
        return "AdaptiveAvgPool2d"
    if torch.allclose(got, plain.amax(dim=(2, 3)), rtol=1e-4, atol=1e-5):
        return "AdaptiveMaxPool2d"
    return "GlobalPool"


def describe(name: str, args: tuple, kwargs: dict, out: Any) -> dict:
    """Return the layer a call is, with the sizes a check reads, or its function's name."""
    if name == "conv2d" and len(args) > 1:
        weight = args[1]
        groups = argument(args, kwargs, 6, "groups", 1)
        return {
            "kind": "Conv2d",
            "kernel": list(weight.shape[2:]),
            "stride": pair(argument(args, kwargs, 3, "stride", 1)),
            "padding": pair(argument(args, kwargs, 4, "padding", 0)),
            "channels": [int(weight.shape[1]) * groups, int(weight.shape[0])],
            "weight": list(weight.shape),
        }
    if name == "batch_norm":
        return {"kind": "BatchNorm2d", "channels": int(args[0].shape[1])}
    if name in RELUS:
        return {"kind": "ReLU"}
    if name == "linear" and len(args) > 1:
        return {"kind": "Linear", "weight": list(args[1].shape)}
    if name in ADDITIONS:
        return {"kind": "add"}
    if name in NAMED_POOLS:
        pool = global_pool(args[0], tensors_in(out)[0])
        if pool is not None:
            return {"kind": pool, "size": [1, 1]}
        if "adaptive" in name:
            size = argument(args, kwargs, 1, "output_size", 1)
            return {"kind": NAMED_POOLS[name], "size": pair(size)}
        kernel = argument(args, kwargs, 1, "kernel_size", 1)
        stride = argument(args, kwargs, 2, "stride", None)
        return {"kind": NAMED_POOLS[name], "kernel": pair(kernel), "stride": pair(stride or kernel)}
    outputs = tensors_in(out)
    if args and isinstance(args[0], Tensor) and outputs:
        pool = global_pool(args[0], outputs[0])
        if pool is not None:
            return {"kind": pool, "size": [1, 1]}
    return {"kind": name}


class _Recorder(TorchFunctionMode):
    """Note each call that makes a tensor: what it is, and which calls made its inputs."""

    def __init__(self, parameters: dict[int, int]) -> None:
        super().__init__()
        self.parameters = parameters  # id of each parameter -> its number in the network
        self.made_by: dict[int, int] = {}  # id of a tensor -> the call that last made it
        self.kept: list[Tensor] = []  # every tensor seen, alive so that no id is reused
        self.ops: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        made = tensors_in(out)
        if not made:
            return out
        inputs = tensors_in((args, kwargs))
        name = getattr(func, "__name__", str(func))
        op = describe(name, args, kwargs, out)
        op["sources"] = [
            self.made_by.get(id(t), NETWORK_INPUT) for t in inputs if id(t) not in self.parameters
        ]
        op["params"] = sorted({self.parameters[id(t)] for t in inputs if id(t) in self.parameters})
        self.kept += inputs + made
        for t in made:
            self.made_by[id(t)] = len(self.ops)
        self.ops.append(op)
        return out


def recorded_forward(net: nn.Module, x: Tensor) -> dict:
    """Run `net` on `x` in eval mode, without gradients, and return what ran: 'ops', the
    calls in order (see `describe`; each with 'sources', the calls that made its inputs, and
    'params', the numbers of the parameters it used), 'sizes', each parameter's number of
    values by its number, and 'finished', False where the pass raised (what ran before is
    kept). Run lazy layers once before, so that their making is not recorded as the
    network's."""
    parameters = list(dict.fromkeys(net.parameters()))
    recorder = _Recorder({id(p): i for i, p in enumerate(parameters)})
    net.eval()
    finished = True
    try:
        with torch.no_grad(), recorder:
            net(x)
    except Exception:  # the case's own call of the network says why; keep what ran
        finished = False
    return {"ops": recorder.ops, "sizes": [p.numel() for p in parameters], "finished": finished}
