"""A corpus of the calls data-parallel code makes on GPUs, to run on stand-ins and on GPUs.

Each case takes two devices (`sim:0, sim:1` under the stand-ins, `cuda:0, cuda:1` on a GPU
server) and returns what the calls gave, described by `seen`: each tensor as its device
(`dev0`, `dev1`, `cpu`), dtype, shape, values and whether it requires grad; an error as its
type and the words that matter. Next to it, `expected` says what a GPU gives, computed on
plain CPU tensors (or, for errors, written out). tests/test_device_corpus.py compares the two
under the stand-ins in `make test`, and on two real GPUs, where there are two, in
`make gpu-check` (grader/benchmarks/gpu_check.py runs that file's `multigpu` test), so the
stand-ins and the GPUs are held to the same answers.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.cuda.comm as comm
from torch import nn


@dataclass(frozen=True)
class Seen:
    """One tensor as a test compares it: where it is, its type and values."""

    where: str
    dtype: torch.dtype
    values: torch.Tensor
    requires_grad: bool = False

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Seen)
            and (self.where, self.dtype, self.requires_grad)
            == (other.where, other.dtype, other.requires_grad)
            and self.values.shape == other.values.shape
            and torch.allclose(self.values, other.values, rtol=1e-5, atol=1e-6)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Raised:
    """An error: its type's name and words its message must hold."""

    kind: str
    words: str

    def __eq__(self, other) -> bool:
        if not isinstance(other, Raised) or self.kind != other.kind:
            return False
        return self.words in other.words or other.words in self.words

    __hash__ = None  # type: ignore[assignment]


def seen(value):
    """Describe `value` (tensors in lists, tuples and dicts) so that it can be compared."""
    if isinstance(value, torch.Tensor):
        device = value.device
        where = "cpu" if device.type == "cpu" else f"dev{device.index or 0}"
        return Seen(where, value.dtype, value.detach().cpu().to(torch.float64), value.requires_grad)
    if isinstance(value, list | tuple):
        return [seen(v) for v in value]
    if isinstance(value, dict):
        return {k: seen(v) for k, v in value.items()}
    return value


def on(where: str, values, dtype=torch.float32, requires_grad: bool = False) -> Seen:
    """What a tensor with these values should be seen as (for `expected`)."""
    values = torch.as_tensor(values).to(dtype)
    return Seen(where, dtype, values.to(torch.float64), requires_grad)


def run(case: Callable, devices: list[torch.device]):
    """Run a case on `devices` and describe what it gave, or the error it raised."""
    torch.manual_seed(0)
    try:
        return seen(case(devices))
    except Exception as error:  # the case's point may be the error
        return Raised(type(error).__name__, str(error))


X = torch.arange(12.0).reshape(6, 2)


def lenet_like() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.BatchNorm1d(4), nn.Linear(4, 1))


def one_device_step() -> list:
    """The reference for the replicated steps, on one (CPU) device: each half of the batch
    through the network on its own (batch norm takes each replica's statistics), the outputs
    stacked, and the gradients of their sum."""
    net = lenet_like()
    out = torch.cat([net(X[:3]), net(X[3:])])
    out.sum().backward()
    return [out.detach(), *[p.grad for p in net.parameters()]]


# ---- torch.cuda.comm ------------------------------------------------------------------------


def broadcast_to_devices(devices):
    x = X.to(devices[0])
    copies = comm.broadcast(x, devices)
    return [*copies, copies[0] is x]


def broadcast_from_the_cpu_by_number(devices):
    return list(comm.broadcast(X, [0, 1]))


def broadcast_into_out(devices):
    out = [torch.zeros(6, 2, device=d) for d in devices]
    got = comm.broadcast(X.to(devices[1]), out=out)
    return [*out, all(a is b for a, b in zip(got, out, strict=True))]


def broadcast_coalesced_keeps_the_first(devices):
    tensors = [X.to(devices[0]).requires_grad_(), torch.ones(3, device=devices[0])]
    copies = comm.broadcast_coalesced(tensors, devices)
    return [copies[1], all(a is b for a, b in zip(copies[0], tensors, strict=True))]


def broadcast_coalesced_off_the_first_device(devices):
    return comm.broadcast_coalesced([X.to(devices[1])], devices)


def scatter_like_chunk(devices):
    return list(comm.scatter(X, devices))


def scatter_with_sizes_along_dim_1(devices):
    wide = torch.arange(10.0).reshape(2, 5)
    return list(comm.scatter(wide.to(devices[0]), devices, chunk_sizes=[2, 3], dim=1))


def gather_to_a_device_and_to_the_cpu(devices):
    parts = [X[:4].to(devices[0]), X[4:].to(devices[1])]
    return [comm.gather(parts, destination=1), comm.gather(parts, destination=-1)]


def gather_a_cpu_tensor(devices):
    return comm.gather([X.to(devices[0]), X], destination=0)


def reduce_add_and_broadcast_back(devices):
    """The allreduce of the from-scratch notebook in two calls."""
    data = [torch.full((2, 2), float(i + 1), device=d) for i, d in enumerate(devices)]
    total = comm.reduce_add(data, destination=data[0].get_device())
    comm.broadcast(total, out=data)
    return data


def reduce_add_onto_the_current_device(devices):
    return comm.reduce_add([torch.ones(2, device=d) for d in reversed(devices)])


def scatter_onto_a_generator_of_devices(devices):
    return list(comm.scatter(X, (d for d in devices)))


def reduce_add_coalesced_sums_each(devices):
    grads = [
        [torch.ones(2, device=d) * (i + 1), torch.ones(3, device=d)] for i, d in enumerate(devices)
    ]
    return list(comm.reduce_add_coalesced(grads, destination=0))


# ---- nn.parallel ----------------------------------------------------------------------------


def replicate_apply_gather_backward(devices):
    net = lenet_like().to(devices[0])
    replicas = nn.parallel.replicate(net, devices)
    shards = nn.parallel.scatter(X.to(devices[0]), devices)
    outputs = nn.parallel.parallel_apply(replicas, shards, devices=devices)
    out = nn.parallel.gather(outputs, devices[0])
    out.sum().backward()
    return [out.detach(), *[p.grad for p in net.parameters()]]


def data_parallel_backward(devices):
    net = lenet_like().to(devices[0])
    out = nn.parallel.data_parallel(net, X.to(devices[0]), devices)
    out.sum().backward()
    return [out.detach(), *[p.grad for p in net.parameters()]]


def scatter_a_tuple_and_a_dict(devices):
    return nn.parallel.scatter(({"x": X}, torch.arange(6)), devices)


def parallel_apply_names_the_failing_replica(devices):
    def fail_on_second(x):
        if x.device == devices[1]:
            raise ValueError("no")
        return x

    modules = [nn.Identity(), nn.Identity()]
    modules[1].forward = fail_on_second
    return nn.parallel.parallel_apply(modules, [X.to(d) for d in devices], devices=devices)


def work_inside_a_device_context(devices):
    results = []
    for i, d in enumerate(devices):
        with torch.cuda.device(d):
            results.append(torch.full((2,), float(i), device=d) * 2)
    return results


def replicate_a_cpu_module(devices):
    return nn.parallel.replicate(nn.Linear(2, 1), devices)


def data_parallel_with_the_module_elsewhere(devices):
    return nn.parallel.data_parallel(nn.Linear(2, 1).to(devices[1]), X.to(devices[1]), devices)


CASES: dict[str, tuple[Callable, Callable]] = {
    "broadcast_to_devices": (
        broadcast_to_devices,
        lambda: [on("dev0", X), on("dev1", X), True],
    ),
    "broadcast_from_the_cpu_by_number": (
        broadcast_from_the_cpu_by_number,
        lambda: [on("dev0", X), on("dev1", X)],
    ),
    "broadcast_into_out": (broadcast_into_out, lambda: [on("dev0", X), on("dev1", X), True]),
    "broadcast_coalesced_keeps_the_first": (
        broadcast_coalesced_keeps_the_first,
        lambda: [[on("dev1", X), on("dev1", torch.ones(3))], True],
    ),
    "broadcast_coalesced_off_the_first_device": (
        broadcast_coalesced_off_the_first_device,
        lambda: Raised("RuntimeError", "tensors must be on devices[0]"),
    ),
    "scatter_like_chunk": (scatter_like_chunk, lambda: [on("dev0", X[:3]), on("dev1", X[3:])]),
    "scatter_with_sizes_along_dim_1": (
        scatter_with_sizes_along_dim_1,
        lambda: [
            on("dev0", torch.arange(10.0).reshape(2, 5)[:, :2]),
            on("dev1", torch.arange(10.0).reshape(2, 5)[:, 2:]),
        ],
    ),
    "gather_to_a_device_and_to_the_cpu": (
        gather_to_a_device_and_to_the_cpu,
        lambda: [on("dev1", X), on("cpu", X)],
    ),
    "gather_a_cpu_tensor": (
        gather_a_cpu_tensor,
        lambda: Raised("RuntimeError", "Expected all input tensors to be CUDA tensors"),
    ),
    "reduce_add_and_broadcast_back": (
        reduce_add_and_broadcast_back,
        lambda: [on("dev0", torch.full((2, 2), 3.0)), on("dev1", torch.full((2, 2), 3.0))],
    ),
    "reduce_add_onto_the_current_device": (
        reduce_add_onto_the_current_device,
        lambda: on("dev0", torch.full((2,), 2.0)),
    ),
    "scatter_onto_a_generator_of_devices": (
        scatter_onto_a_generator_of_devices,
        lambda: [on("dev0", X[:3]), on("dev1", X[3:])],
    ),
    "reduce_add_coalesced_sums_each": (
        reduce_add_coalesced_sums_each,
        lambda: [on("dev0", torch.full((2,), 3.0)), on("dev0", torch.full((3,), 2.0))],
    ),
    "replicate_apply_gather_backward": (
        replicate_apply_gather_backward,
        lambda: [on("dev0", t) for t in one_device_step()],
    ),
    "data_parallel_backward": (
        data_parallel_backward,
        lambda: [on("dev0", t) for t in one_device_step()],
    ),
    "scatter_a_tuple_and_a_dict": (
        scatter_a_tuple_and_a_dict,
        lambda: [
            [{"x": on("dev0", X[:3])}, on("dev0", torch.arange(3), torch.int64)],
            [{"x": on("dev1", X[3:])}, on("dev1", torch.arange(3, 6), torch.int64)],
        ],
    ),
    "parallel_apply_names_the_failing_replica": (
        parallel_apply_names_the_failing_replica,
        lambda: Raised("ValueError", "Caught ValueError in replica 1 on device 1."),
    ),
    "work_inside_a_device_context": (
        work_inside_a_device_context,
        lambda: [on("dev0", [0.0, 0.0]), on("dev1", [2.0, 2.0])],
    ),
    "replicate_a_cpu_module": (
        replicate_a_cpu_module,
        lambda: Raised("AssertionError", "Broadcast function not implemented for CPU tensors"),
    ),
    "data_parallel_with_the_module_elsewhere": (
        data_parallel_with_the_module_elsewhere,
        lambda: Raised("RuntimeError", "module must have its parameters and buffers on device"),
    ),
}
