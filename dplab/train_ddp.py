"""Train LeNet on Fashion-MNIST with a notebook's `train_ddp`, one process per GPU, under torchrun.

    torchrun --nproc-per-node 2 -m dplab.train_ddp [--notebook PATH] [--epochs 10]

Every process runs this file. torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and the meeting
point; the script joins the group with NCCL and `cuda:LOCAL_RANK` where each process has a
GPU, else with gloo on the CPU, loads `train_ddp` and `lenet` (or `--model NAME`) from the
notebook (its training cells and launches are not run) and trains. Across machines, run the
same command on each with `--nnodes`, `--rdzv-backend c10d` and one `--rdzv-endpoint` (see
the README).

`--record DIR` also writes, per rank, the weights at the first step and at the end, the
examples each step used and the accuracies, so that a test can replay the run in one process.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

LAUNCH_HINT = (
    "dplab.train_ddp runs in each process of a group started by torchrun, e.g.\n"
    "  torchrun --nproc-per-node 2 -m dplab.train_ddp --notebook distributed.ipynb"
)


def default_notebook() -> Path:
    """Return the student's notebook where it is (work/, then exercises/), else the release's."""
    for folder in ("work", "exercises"):
        candidate = Path(folder) / "multigpu" / "distributed.ipynb"
        if candidate.exists():
            return candidate
    return Path("distributed.ipynb")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dplab.train_ddp", description=__doc__.split("\n")[0])
    parser.add_argument("--notebook", type=Path, default=None, help="whose train_ddp to run")
    parser.add_argument(
        "--model", default="lenet", help="the notebook's function that builds the network"
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256, help="the global batch")
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--data", choices=["auto", "full", "sample"], default="auto")
    parser.add_argument(
        "--subset", type=int, nargs=2, metavar=("TRAIN", "TEST"), help="keep only the first"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", type=Path, help="write each rank's run there (for tests)")
    return parser.parse_args(argv)


def join_group() -> torch.device:
    """Join the group torchrun described; return this process's device."""
    local_rank = int(os.environ["LOCAL_RANK"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_size:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        return torch.device("cuda", local_rank)
    if local_size == int(os.environ["WORLD_SIZE"]):  # one machine: gloo over its loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    dist.init_process_group("gloo")
    return torch.device("cpu")


def load_functions(notebook: Path, model: str) -> dict:
    """Return the notebook's definitions, with none of its training or launches run."""
    from grader.load.notebook import NotebookError, load_notebook
    from grader.manifest import load_manifest

    try:
        loaded = load_notebook(notebook, load_manifest().training_functions)
    except NotebookError as error:
        raise SystemExit(f"dplab.train_ddp: {error}") from None
    for name in ("train_ddp", model):
        if not callable(loaded.namespace.get(name)):
            raise SystemExit(f"dplab.train_ddp: {notebook} defines no function `{name}`")
    return loaded.namespace


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        print(LAUNCH_HINT, file=sys.stderr)
        return 2
    notebook = args.notebook or default_notebook()
    if not notebook.exists():
        print(f"dplab.train_ddp: no notebook at {notebook}; pass --notebook PATH", file=sys.stderr)
        return 2
    import dplab

    device = join_group()
    rank = dist.get_rank()
    try:
        found = load_functions(notebook, args.model)
        source = "sample" if args.data == "sample" else args.data
        train_set, test_set = dplab.fashion_mnist_datasets(
            source=source, subset=tuple(args.subset) if args.subset else None
        )
        torch.manual_seed(args.seed)
        net = found[args.model]()
        record = Recorder(net, train_set, rank) if args.record else None
        data = (record.dataset if record else train_set, test_set)
        history = found["train_ddp"](net, args.epochs, args.batch_size, args.lr, data, device)
        if record:
            record.save(args.record, history)
    finally:
        dist.destroy_process_group()
    return 0


class Recorder:
    """Notes a rank's run: the weights at its first training step and at the end, and the
    examples each step used (grader.checks.train_ddp replays such a run)."""

    def __init__(self, net: torch.nn.Module, train_set, rank: int) -> None:
        from grader.checks.train_ddp import RunLog, state

        self.net, self.rank, self.state = net, rank, state
        self.run = RunLog(net, train_set.tensors[0])
        self.dataset = train_set

    def save(self, folder: Path, history: list[float]) -> None:
        self.run.close()
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"first": self.run.first, "final": self.state(self.net), "log": self.run.log,
             "history": list(history)},
            folder / f"rank{self.rank}.pt",
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
