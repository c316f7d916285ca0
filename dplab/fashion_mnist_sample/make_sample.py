"""Make the embedded Fashion-MNIST sample from a full copy of the set.

Run: python dplab/fashion_mnist_sample/make_sample.py [FOLDER_WITH_THE_FOUR_FILES]
(default: the dataset-fashion-mnist package's folder). It draws a fixed number of images of
every class, with a fixed seed, and writes them in the original IDX format, gzipped with a
zero timestamp so that running it again gives identical files.
"""

import gzip
import struct
import sys
from pathlib import Path

import torch

from dplab.data import FILES, files_in, read_idx

PER_CLASS = {"train": 400, "test": 100}
SEED = 20250118
HERE = Path(__file__).parent


def write_idx(path: Path, tensor: torch.Tensor) -> None:
    """Write a uint8 tensor as a gzipped IDX file."""
    header = bytes([0, 0, 0x08, tensor.dim()]) + struct.pack(f">{tensor.dim()}I", *tensor.shape)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(header + tensor.contiguous().numpy().tobytes())


def main(folder: Path) -> None:
    found = files_in(folder)
    if found is None:
        sys.exit(f"{folder} does not hold the four Fashion-MNIST files")
    gen = torch.Generator().manual_seed(SEED)
    for split, per_class in PER_CLASS.items():
        images, labels = read_idx(found[f"{split}_images"]), read_idx(found[f"{split}_labels"])
        picks = []
        for c in range(10):
            members = (labels == c).nonzero().flatten()
            picks.append(members[torch.randperm(len(members), generator=gen)[:per_class]])
        order = torch.cat(picks)
        order = order[torch.randperm(len(order), generator=gen)]
        write_idx(HERE / f"{FILES[f'{split}_images']}.gz", images[order])
        write_idx(HERE / f"{FILES[f'{split}_labels']}.gz", labels[order])
        print(f"{split}: {len(order)} images")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/usr/share/datasets/fashion-mnist"))
