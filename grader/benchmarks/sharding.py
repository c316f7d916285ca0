"""`make bench-distributed`, second part: what sharding costs and saves, per rank, beside the
ZeRO paper's formulas.

For DDP and ZeRO stages 1, 2 and 3 with Adam (K = 2 values of state per parameter value), at
2, 3 and 4 processes on gloo, it prints the bytes that rank 0 sends in one training step and
the bytes it holds after it (parameters, gradients, optimizer state), with the formulas for P
float32 parameter values over N ranks:

- sent: 2 (N - 1) / N x 4P for DDP and stages 1 and 2, 3 (N - 1) / N x 4P for stage 3;
- held: (2 + K) P x 4 for DDP, (2P + K ceil(P / N)) x 4 for stage 1, (P + (1 + K) ceil(P / N))
  x 4 for stage 2, and (2 + K) ceil(P / N) x 4 for stage 3, whose chunks are per layer, so
  that its ceil(P / N) is the sum of each layer's ceil(P_layer / N).

The measure is the sharded notebook's own `one_step`, from its reference (set-up and solution
cells, as the grader loads them: `ShardedOptimizer`, `Zero2Optimizer`, `shard_layers`, the
ring's two halves and the counter of sends), run for the notebook's MLP, for the distributed
notebook's LeNet (as the sharded notebook defines it) and for the MLP 16 times wider. The
figures held are the formulas', byte for byte. Those sent are the paper's where N divides each
tensor sent; elsewhere rank 0, whose chunks are the largest, sends under one value less per
ring half than the ranks' mean, which is the paper's figure (`ring_count` counts it exactly).
It prints figures and asserts nothing.
"""

import argparse
import os
import time
import types
from collections.abc import Callable
from functools import cache

import torch
import torch.distributed as dist
from torch import nn

import dplab
from dplab.notebook import definitions
from grader.load.reference import reference
from grader.manifest import solutions_dir

NOTEBOOK = "sharded.ipynb"
K = 2  # Adam's values of state per parameter value: exp_avg and exp_avg_sq
BYTES = 4  # float32


def wide_mlp() -> nn.Module:
    """The notebook's MLP with 1,024 hidden units instead of 64 (814,090 parameter values)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10))


@cache
def models() -> dict[str, Callable[[], nn.Module]]:
    """Return the models measured, by name: the notebooks' own, and `wide_mlp`. The LeNet
    cell also prints a table, so it is read with the notebook's definitions (its call of
    `memory_table` left out), not with the reference's set-up cells."""
    found = definitions(solutions_dir() / NOTEBOOK, frozenset({"memory_table"}))
    return {
        "MLP": reference(NOTEBOOK)["mlp"],
        "LeNet": found["batch_norm_lenet"],
        "wide MLP": wide_mlp,
    }


def one_step_with(make_model: Callable[[], nn.Module]) -> Callable:
    """Return the reference's `one_step`, its `mlp()` calls making `make_model()` instead."""
    ref = reference(NOTEBOOK)
    step = ref["one_step"]
    return types.FunctionType(step.__code__, {**ref, "mlp": make_model}, step.__name__)


def measure_sharding(model: str) -> dict[str, tuple[int, int]]:
    """In every rank: return (bytes sent in one step, bytes held after it) per strategy. The
    notebook's counter wraps dist.send and dist.isend for good; they are put back after
    each strategy, so that each counts its own step alone."""
    step = one_step_with(models()[model])
    measured = {}
    for strategy in reference(NOTEBOOK)["strategies"]:
        send, isend = dist.send, dist.isend
        try:
            measured[strategy] = step(strategy)
        finally:
            dist.send, dist.isend = send, isend
    return measured


def layer_sizes(net: nn.Module) -> list[int]:
    """The parameter values of each layer that `shard_layers` shards (those with any)."""
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in net]
    return [n for n in sizes if n]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def paper(strategy: str, n: int, layers: list[int]) -> tuple[float, int]:
    """Return the ZeRO paper's (bytes sent per step, bytes held) for rank 0 (see above)."""
    p = sum(layers)
    shard = ceil_div(p, n)
    if strategy == "ZeRO-3":
        shards = sum(ceil_div(size, n) for size in layers)
        return 3 * (n - 1) / n * BYTES * p, (2 + K) * shards * BYTES
    held = {"DDP": (2 + K) * p, "ZeRO-1": 2 * p + K * shard, "ZeRO-2": p + (1 + K) * shard}
    return 2 * (n - 1) / n * BYTES * p, held[strategy] * BYTES


def chunk(p: int, n: int, i: int) -> int:
    """The values in chunk i of `tensor_split(n)` of p values: the first p mod n get one more."""
    return p // n + (i < p % n)


def ring_count(strategy: str, n: int, layers: list[int]) -> int:
    """Return the bytes rank 0 sends in one step, counted from the ring: of each tensor
    reduced, every chunk but its own (chunk 0) in the reduce-scatter and every chunk but
    chunk 1 in each all-gather (stage 3: two per layer, in the forward and backward passes).
    The paper's (N - 1) / N of each is the ranks' mean, which rank 0 misses by under one value
    in each half where N does not divide the tensor: its chunks are the largest."""
    tensors, gathers = (layers, 2) if strategy == "ZeRO-3" else ([sum(layers)], 1)
    values = sum((1 + gathers) * p - chunk(p, n, 0) - gathers * chunk(p, n, 1) for p in tensors)
    return values * BYTES if n > 1 else 0


def said(value: float) -> str:
    """A count of bytes: whole where it is whole, else to a tenth."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def print_sharding(model: str, layers: list[int], results: dict[int, dict]) -> None:
    """Print one model's figures beside the formulas (a Markdown table), then what they show."""
    print(f"\n{model}: P = {sum(layers):,} parameter values in {len(layers)} layers with any,")
    print("Adam; bytes of rank 0, sent in one step and held after it")
    print("| strategy | N | sent | formula | held | formula |")
    print("|---|---:|---:|---:|---:|---:|")
    for strategy in next(iter(results.values())):
        for n, measured in results.items():
            row = [*measured[strategy], *paper(strategy, n, layers)]
            print(f"| {strategy} | {n} | " + " | ".join(said(row[i]) for i in (0, 2, 1, 3)) + " |")
    print_findings(layers, results)


def print_findings(layers: list[int], results: dict[int, dict]) -> None:
    """Print whether the figures are the formulas', and stage 3's traffic against DDP's."""

    def yes(found: bool) -> str:
        return "yes" if found else "NO"

    rows = [(n, s, m[s]) for n, m in results.items() for s in m]
    same = all(len({m[s][0] for s in ("DDP", "ZeRO-1", "ZeRO-2")}) == 1 for m in results.values())
    print(f"stages 1 and 2 send what DDP sends, byte for byte: {yes(same)}")
    held = all(got[1] == paper(s, n, layers)[1] for n, s, got in rows)
    print(f"every figure held is the formula's, byte for byte: {yes(held)}")
    counted = all(got[0] == ring_count(s, n, layers) for n, s, got in rows)
    print(f"every figure sent is the ring's own count (ring_count): {yes(counted)}")
    ratios = [f"{m['ZeRO-3'][0] / m['DDP'][0]:.5f} at {n}" for n, m in results.items() if n > 1]
    print(f"ZeRO-3 sends, against DDP: {', '.join(ratios)} processes")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grader.benchmarks.sharding")
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--models", nargs="+", default=["MLP", "LeNet", "wide MLP"])
    args = parser.parse_args(argv)
    print(f"\n{os.cpu_count()} cores, {torch.cuda.device_count()} GPUs: bytes per rank, gloo")
    started = time.monotonic()
    makers = models()  # loaded once here; the ranks inherit them
    for model in args.models:
        results = {
            n: dplab.launch(measure_sharding, (model,), nprocs=n, backend="gloo", show=False).result
            for n in args.procs
        }
        print_sharding(model, layer_sizes(makers[model]()), results)
    print(f"\nsharding measured in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
