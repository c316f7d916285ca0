"""`make bench-distributed`: all-reduce bus bandwidth of the lab's four ways to sum over ranks.

For each group size (2 and 4 processes on gloo, and on NCCL where there are enough GPUs) and
each message size from 4 KiB to 64 MiB, it times one all-reduce of float32 data with
`d2l.time_allreduce` (the median of a few calls, each the slowest rank's time) and prints the
bus bandwidth, as nccl-tests reports it (size / time x 2 (N - 1) / N), for:

- `all_reduce`: torch.distributed's own;
- `ring`: the reference `ring_allreduce` of the distributed notebook;
- `per-parameter`: the reference `average_gradients`, the data cut into 64 gradients;
- `bucketed`: the reference `average_gradients_bucketed` on the same 64 gradients.

It ends with the ring's share of all_reduce's bandwidth at 16 MiB, and saves a plot. Then
how soon a deadlock is called: two ranks that both send first (gloo's send blocks), launched
with an idle limit of 3 s and of 120 s; the launcher calls ranks that sleep in
torch.distributed deadlocked well before either limit (tests/test_distributed.py checks the
steps that lead there, never their time). It prints figures and asserts nothing: how fast a
machine is, is not a test.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import dplab
from grader.load.reference import reference

SIZES = [4 * 2**10 * 4**i for i in range(8)]  # 4 KiB to 64 MiB
PIECES = 64  # gradients per message for the model-based versions (ResNet-18 has 62)


def as_model(flat: torch.Tensor, pieces: int = PIECES) -> nn.Module:
    """Return a module whose parameters' gradients are `pieces` views of `flat`."""
    model = nn.Module()
    chunks = [c for c in flat.tensor_split(pieces) if c.numel()]
    model.params = nn.ParameterList(nn.Parameter(torch.zeros_like(c)) for c in chunks)
    for p, c in zip(model.params, chunks, strict=True):
        p.grad = c
    return model


def measure_bandwidth(sizes: list[int], repeats: int) -> dict[str, list[float]]:
    """In every rank: return the bus bandwidth of each method at each size, in GB/s."""
    ref = reference("distributed.ipynb")
    models: dict[int, nn.Module] = {}

    def through(average):
        def reduce(tensor):
            if tensor.data_ptr() not in models:
                models[tensor.data_ptr()] = as_model(tensor)
            average(models[tensor.data_ptr()])

        return reduce

    methods = {
        "all_reduce": dist.all_reduce,
        "ring": ref["ring_allreduce"],
        "per-parameter": through(ref["average_gradients"]),
        "bucketed": through(ref["average_gradients_bucketed"]),
    }
    world = dist.get_world_size()
    table = {}
    for name, fn in methods.items():
        seconds = dplab.time_allreduce(fn, sizes, repeats)
        pairs = zip(sizes, seconds, strict=True)
        table[name] = [dplab.bus_bandwidth(n, t, world) for n, t in pairs]
    return table


def sends_first() -> None:
    """Both ranks send first, then receive: gloo's blocking send makes this a deadlock."""
    t = torch.ones(4)
    peer = 1 - dist.get_rank()
    dist.send(t, peer)
    dist.recv(t, peer)


def deadlock_seconds(idle_timeout: float) -> float:
    """Return how long a launch of `sends_first` takes to end as deadlocked (RanksHung)."""
    started = time.monotonic()
    try:
        dplab.launch(sends_first, nprocs=2, backend="gloo", idle_timeout=idle_timeout, show=False)
    except dplab.distributed.RanksHung:
        return time.monotonic() - started
    raise RuntimeError("the deadlock was not called")


def nccl_runs(n: int, asked: list[str]) -> bool:
    """Return True where NCCL is to run on `n` processes: a GPU for each, or, with fewer GPUs,
    where NCCL alone was asked for (the processes then share the GPUs)."""
    if not dist.is_nccl_available() or torch.cuda.device_count() == 0:
        return False
    return torch.cuda.device_count() >= n or asked == ["nccl"]


def human(nbytes: int) -> str:
    return f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // 2**10} KiB"


def print_bandwidth(title: str, sizes: list[int], table: dict[str, list[float]]) -> None:
    names = list(table)
    print(f"\n{title}: bus bandwidth in GB/s")
    print("| size | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for i, n in enumerate(sizes):
        print(f"| {human(n)} | " + " | ".join(f"{table[m][i]:.3f}" for m in names) + " |")


def plot(results: dict[str, dict[str, list[float]]], sizes: list[int], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 * len(results), 3))
    axes = fig.subplots(1, len(results), sharey=True, squeeze=False)[0]
    for ax, (title, table) in zip(axes, results.items(), strict=True):
        for name, values in table.items():
            ax.plot([n / 2**10 for n in sizes], values, "o-", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (KiB)")
        ax.set_title(title)
        ax.grid(True)
    axes[0].set_ylabel("bus bandwidth (GB/s)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grader.benchmarks.bandwidth")
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="bytes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plot", type=Path, default=Path("bench-distributed.png"))
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=["gloo", "nccl"],
        default=["gloo", "nccl"],
        help="NCCL runs where there is a GPU per process, or where named here alone: then "
        "the processes share the GPUs, if NCCL allows it",
    )
    parser.add_argument("--no-deadlock", action="store_true", help="skip the deadlock timing")
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} cores, {torch.cuda.device_count()} GPUs")
    reference("distributed.ipynb")  # loaded once here; the ranks inherit it
    results = {}
    for backend in args.backends:
        for n in args.procs:
            if backend == "nccl" and not nccl_runs(n, args.backends):
                continue
            title = f"{n} processes, {backend}"
            try:
                done = dplab.launch(
                    measure_bandwidth,
                    (args.sizes, args.repeats),
                    nprocs=n,
                    backend=backend,
                    show=False,
                )
            except dplab.distributed.LaunchError as error:
                print(f"\n{title}: no figures, the launch failed: {str(error)[:600]}")
                continue
            results[title] = done.result
            print_bandwidth(title, args.sizes, done.result)
            if 16 * 2**20 in args.sizes:
                i = args.sizes.index(16 * 2**20)
                share = done.result["ring"][i] / done.result["all_reduce"][i]
                print(f"at 16 MiB the ring reaches {share:.0%} of all_reduce's bus bandwidth")
    if results:
        plot(results, args.sizes, args.plot)
        print(f"\nplot written to {args.plot}")
    for idle in () if args.no_deadlock else (3.0, 120.0):
        runs = sorted(deadlock_seconds(idle) for _ in range(3))
        said = ", ".join(f"{s:.2f}" for s in runs)
        print(f"a send/send deadlock of 2 ranks, idle limit {idle:g} s: called after {said} s")


if __name__ == "__main__":
    main()
