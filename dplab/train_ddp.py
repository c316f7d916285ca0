"""Train LeNet on Fashion-MNIST with a notebook's `train_ddp`, one process per GPU, under torchrun.

    torchrun --nproc-per-node 2 -m dplab.train_ddp [--notebook PATH] [--epochs 10]

Every process runs this file. torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and the meeting
point; the script joins the group with NCCL and `cuda:LOCAL_RANK` where each process has a
GPU, else with gloo on the CPU, loads `train_ddp` and `lenet` (or `--model NAME`) from the
notebook (its training runs and launches are not run: dplab.notebook) and trains. Across
machines, run the same command on each with `--nnodes`, `--rdzv-backend c10d` and one
`--rdzv-endpoint` (see docs/distributed.md).
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from labtext import N_, _

DESCRIPTION = N_(
    "Train LeNet on Fashion-MNIST with a notebook's `train_ddp`, one process per GPU, under "
    "torchrun."
)
LAUNCH_HINT = N_(
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
    parser = argparse.ArgumentParser(prog="dplab.train_ddp", description=_(DESCRIPTION))
    parser.add_argument("--notebook", type=Path, default=None, help=_("whose train_ddp to run"))
    parser.add_argument(
        "--model", default="lenet", help=_("the notebook's function that builds the network")
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256, help=_("the global batch"))
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument(
        "--data",
        choices=["auto", "full", "sample"],
        default=None,
        help=_("which Fashion-MNIST to train on [DPLAB_DATA_SOURCE, else auto]"),
    )
    parser.add_argument(
        "--subset",
        type=int,
        nargs=2,
        metavar=("TRAIN", "TEST"),
        help=_("keep only the first"),
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help=_("auto: NCCL where each process has a GPU of its own, else gloo on the CPU"),
    )
    return parser.parse_args(argv)


def join_group(backend: str = "auto") -> torch.device:
    """Join the group torchrun described; return this process's device. NCCL asked for with
    fewer GPUs than processes puts them on the GPUs in turn (NCCL itself may refuse that)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and not gpus:
        raise SystemExit(_("dplab.train_ddp: --backend nccl needs a CUDA GPU, and none is here"))
    if backend == "nccl" or (backend == "auto" and gpus >= local_size):
        device = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    if local_size == int(os.environ["WORLD_SIZE"]):  # one machine: gloo over its loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    dist.init_process_group("gloo")
    return torch.device("cpu")


def load_functions(notebook: Path, model: str) -> dict:
    """Return the notebook's definitions, with none of its training runs or launches run."""
    from dplab.notebook import NotebookError, definitions

    try:
        found = definitions(notebook, skip_calls=frozenset({"train_ddp", "train"}))
    except (NotebookError, SyntaxError) as error:
        raise SystemExit(f"dplab.train_ddp: {notebook}: {error}") from None
    for name in ("train_ddp", model):
        if not callable(found.get(name)):
            raise SystemExit(
                _("dplab.train_ddp: {notebook} defines no function `{name}`").format(
                    notebook=notebook, name=name
                )
            )
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        print(_(LAUNCH_HINT), file=sys.stderr)
        return 2
    notebook = args.notebook or default_notebook()
    if not notebook.exists():
        print(
            _("dplab.train_ddp: no notebook at {notebook}; pass --notebook PATH").format(
                notebook=notebook
            ),
            file=sys.stderr,
        )
        return 2
    import dplab

    device = join_group(args.backend)
    try:
        found = load_functions(notebook, args.model)
        train_set, test_set = dplab.fashion_mnist_datasets(
            source=args.data, subset=tuple(args.subset) if args.subset else None
        )
        torch.manual_seed(args.seed)
        net = found[args.model]()
        found["train_ddp"](
            net, args.epochs, args.batch_size, args.lr, (train_set, test_set), device
        )
        # No rank leaves while another still works with the group: gloo, torn down on one
        # rank while its peer finished (rank 0 prints and plots last), aborted that rank
        # with "terminate called without an active exception" in 2 runs of 10.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
