"""`torchrun ... -m tests.ddp_recorded --record DIR [dplab.train_ddp's options]`: what
`dplab.train_ddp` does, with each rank's run noted (the weights at its first step and at the
end, the examples each step used, the accuracies) into DIR/rankR.pt, so that a test can replay
the run in one process (grader.base.inputs.RunLog)."""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import dplab
from dplab import train_ddp
from grader.base.inputs import RunLog, state


def main(argv: list[str] | None = None) -> int:
    ours = argparse.ArgumentParser(add_help=False)
    ours.add_argument("--record", type=Path, required=True)
    recorded, rest = ours.parse_known_args(argv)
    args = train_ddp.parse(rest)
    device = train_ddp.join_group()
    rank = dist.get_rank()
    try:
        notebook = args.notebook or train_ddp.default_notebook()
        found = train_ddp.load_functions(notebook, args.model)
        subset = tuple(args.subset) if args.subset else None
        train_set, test_set = dplab.fashion_mnist_datasets(source=args.data, subset=subset)
        torch.manual_seed(args.seed)
        net = found[args.model]()
        run = RunLog(net, train_set.tensors[0])
        history = found["train_ddp"](net, args.epochs, args.batch_size, args.lr,
                                     (train_set, test_set), device)  # fmt: skip
        run.close()
        recorded.record.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"first": run.first, "final": state(net), "log": run.log, "history": list(history)},
            recorded.record / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
