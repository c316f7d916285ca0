"""A corpus of the calls data-parallel code makes on GPUs, to run on stand-ins and on GPUs.

Each case takes two devices (`sim:0, sim:1` under the stand-ins, `cuda:0, cuda:1` on a GPU
server) and returns what the calls gave, described by `seen`: each tensor as its device
(`dev0`, `dev1`, `cpu`), dtype, shape, values and whether it requires grad; an error as its
type and the words that matter. Next to it, `expected` says what a GPU gives, computed on
plain CPU tensors (or, for errors, written out). The cases in ASK_CUDA ask torch.cuda itself
(how many GPUs, `cuda:i`, streams, autocast): under the stand-ins they run while torch.cuda
answers for them (dplab.sim.answering_as_gpus), as the grader runs the cases of the notebooks
that train on them. tests/test_device_corpus.py compares the two
under the stand-ins in `make test`, and on two real GPUs, where there are two, in
`make gpu-check` (grader/benchmarks/gpu_check.py runs that file's `multigpu` test), so the
stand-ins and the GPUs are held to the same answers.
"""

import warnings
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


# ---- what a program asks of torch.cuda: probes, `cuda:i`, streams, AMP ------------------------


def probes_count_the_devices(devices):
    return [
        torch.cuda.is_available(),
        torch.cuda.device_count() >= len(devices),
        all(isinstance(torch.cuda.get_device_name(i), str) for i in range(len(devices))),
        torch.cuda.get_device_properties(1).total_memory > 0,
        torch.cuda.current_device(),
    ]


def cuda_names_the_devices(devices):
    net = nn.Linear(2, 1).cuda(1)
    return [
        torch.zeros(2, device="cuda"),
        torch.ones(2).cuda(),
        torch.ones(2).to("cuda:1"),
        torch.ones(2).to(1),
        torch.full((2,), 3.0, device=torch.device("cuda", 1)),
        [p.detach() for p in net.parameters()],
    ]


def an_index_past_the_last_gpu_fails(devices):
    return torch.zeros(1, device=f"cuda:{torch.cuda.device_count()}")


def set_device_and_device_context(devices):
    torch.cuda.set_device(1)
    try:
        made = [torch.zeros(1, device="cuda"), torch.ones(1).cuda(), torch.cuda.current_device()]
    finally:
        torch.cuda.set_device(0)
    with torch.cuda.device(1):
        made.append(torch.zeros(1, device="cuda"))
    return [*made, torch.zeros(1, device="cuda"), torch.cuda.current_device()]


def tutorial_idiom_wraps_every_gpu(devices):
    """PyTorch's tutorial: wrap only where there is more than one GPU, on every GPU there is."""
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(1)
    model = nn.Linear(2, 1)
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model.to(device)
    out = model(X.to(device))
    wrapped = isinstance(model, nn.DataParallel)
    return [wrapped, wrapped and len(model.device_ids) == torch.cuda.device_count(), out.detach()]


def streams_and_events(devices):
    x = torch.arange(4.0, device=devices[1])
    side = torch.cuda.Stream(device=devices[1])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    with torch.cuda.stream(side):
        y = x * 2
    torch.cuda.current_stream(devices[1]).wait_stream(side)
    end.record()
    torch.cuda.synchronize()
    torch.cuda.synchronize(devices[1])
    return [y, start.elapsed_time(end) >= 0, side.query()]


def autocast_computes_in_lower_precision(devices):
    net = nn.Linear(2, 2).to(devices[0])
    x = X.to(devices[0])
    exact = net(x)
    with torch.autocast("cuda"):
        half = net(x)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        brain = net(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp's name is deprecated
        with torch.cuda.amp.autocast():
            old = net(x)
    close = torch.allclose(half.float(), exact, rtol=1e-2, atol=1e-2)
    return [half.dtype, brain.dtype, old.dtype, net(x).dtype, close]


def grad_scaler_loop(devices, make_scaler: Callable) -> list:
    """Ten AMP steps that train, then a step whose gradients overflow: it is skipped and the
    scale halves."""
    torch.manual_seed(2)
    net = nn.Linear(4, 3).to(devices[0])
    data, labels = torch.randn(16, 4).to(devices[0]), torch.randint(0, 3, (16,)).to(devices[0])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    scaler = make_scaler()
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            loss = nn.functional.cross_entropy(net(data), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    scale, before = scaler.get_scale(), net.weight.detach().clone()
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = net(data).sum() * float("inf")
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    kept = torch.equal(net.weight.detach(), before)
    return [losses[-1] < 0.9 * losses[0], scale, scaler.get_scale(), kept, net.weight.dtype]


def grad_scaler_trains(devices):
    return grad_scaler_loop(devices, lambda: torch.amp.GradScaler("cuda", init_scale=1024.0))


def grad_scaler_by_its_old_name(devices):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return grad_scaler_loop(devices, lambda: torch.cuda.amp.GradScaler(init_scale=1024.0))


def the_gradient_of_a_cast_stays_on_its_device(devices):
    x = X.to(devices[1]).requires_grad_()
    (x.half() * 2).float().sum().backward()
    return x.grad


def one_linear_output() -> torch.Tensor:
    torch.manual_seed(1)
    return nn.Linear(2, 1)(X).detach()


def linear_parameters() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [p.detach() for p in nn.Linear(2, 1).parameters()]


# The cases that ask torch.cuda itself: they need a machine whose torch.cuda speaks of the
# devices (under stand-ins, dplab.sim.answering_as_gpus, which the grader turns on).
ASK_CUDA = {
    "probes_count_the_devices",
    "cuda_names_the_devices",
    "an_index_past_the_last_gpu_fails",
    "set_device_and_device_context",
    "tutorial_idiom_wraps_every_gpu",
    "streams_and_events",
    "autocast_computes_in_lower_precision",
    "grad_scaler_trains",
    "grad_scaler_by_its_old_name",
}
SCALER = [True, 1024.0, 512.0, True, torch.float32]  # no step overflows but the last

CASES: dict[str, tuple[Callable, Callable]] = {
    "probes_count_the_devices": (probes_count_the_devices, lambda: [True, True, True, True, 0]),
    "cuda_names_the_devices": (
        cuda_names_the_devices,
        lambda: [
            on("dev0", torch.zeros(2)),
            on("dev0", torch.ones(2)),
            on("dev1", torch.ones(2)),
            on("dev1", torch.ones(2)),
            on("dev1", torch.full((2,), 3.0)),
            [on("dev1", p) for p in linear_parameters()],
        ],
    ),
    "an_index_past_the_last_gpu_fails": (
        an_index_past_the_last_gpu_fails,
        lambda: Raised("RuntimeError", "invalid device ordinal"),
    ),
    "set_device_and_device_context": (
        set_device_and_device_context,
        lambda: [
            on("dev1", [0.0]),
            on("dev1", [1.0]),
            1,
            on("dev1", [0.0]),
            on("dev0", [0.0]),
            0,
        ],
    ),
    "tutorial_idiom_wraps_every_gpu": (
        tutorial_idiom_wraps_every_gpu,
        lambda: [True, True, on("dev0", one_linear_output())],
    ),
    "streams_and_events": (
        streams_and_events,
        lambda: [on("dev1", [0.0, 2.0, 4.0, 6.0]), True, True],
    ),
    "autocast_computes_in_lower_precision": (
        autocast_computes_in_lower_precision,
        lambda: [torch.float16, torch.bfloat16, torch.float16, torch.float32, True],
    ),
    "grad_scaler_trains": (grad_scaler_trains, lambda: SCALER),
    "grad_scaler_by_its_old_name": (grad_scaler_by_its_old_name, lambda: SCALER),
    "the_gradient_of_a_cast_stays_on_its_device": (
        the_gradient_of_a_cast_stays_on_its_device,
        lambda: on("dev1", torch.full((6, 2), 2.0)),
    ),
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
