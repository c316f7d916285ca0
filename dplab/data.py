"""Fashion-MNIST: found wherever it already is, decoded once, and batched from memory.

Where the images come from, in order:
1. a folder you name (`path=` or the environment variable `DPLAB_FASHION_MNIST`);
2. torchvision's layout under the data root (`$DPLAB_DATA_ROOT`, else `~/.cache/dplab`),
   that is `<root>/FashionMNIST/raw/`;
3. the four `.gz` files of the Debian/Ubuntu package `dataset-fashion-mnist`;
4. a torchvision download into the data root (skipped when `DPLAB_OFFLINE=1`);
5. the small sample shipped inside this package, so that everything works offline.

`DPLAB_DATA_SOURCE=sample` (or `full`) overrides the default choice, "auto".
`DPLAB_DATA_LIMIT=TRAIN,TEST` keeps only the first TRAIN training and TEST test images of
whichever set is used: for quick runs of whole notebooks, such as the lab's own tests.

`load_data_fashion_mnist` keeps the decoded images in memory as one uint8 tensor and cuts
minibatches out of it by index: no per-image PIL work, no worker processes.
`load_data_fashion_mnist_book` is the book's torchvision `DataLoader` pipeline, kept for comparison.
"""

import gzip
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import torch
from torch import Tensor
from torch.nn import functional as F

from dplab import settings
from labtext import N_, _

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
SAMPLE_DIR = Path(__file__).parent / "fashion_mnist_sample"
SYSTEM_DIRS = [
    Path("/usr/share/datasets/fashion-mnist"),
    Path("/usr/local/share/datasets/fashion-mnist"),
]
TEXT_LABELS = [
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
]  # fmt: skip


class DataNotFound(FileNotFoundError):
    """Raised when the full Fashion-MNIST set was asked for and none was found."""


@dataclass(frozen=True)
class FashionMNIST:
    """The decoded set: uint8 images of shape (N, 28, 28) and int64 labels, plus their origin."""

    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    source: str
    folder: Path
    is_sample: bool


def data_root() -> Path:
    """Return the folder that holds torchvision's `FashionMNIST/raw` layout and downloads."""
    return Path(settings.DATA_ROOT.get()).expanduser()


def files_in(folder: Path) -> dict[str, Path] | None:
    """Return the four files in `folder` (plain or `.gz`), or None if any is missing."""
    found = {}
    for key, name in FILES.items():
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                found[key] = candidate
                break
        else:
            return None
    return found


def read_idx(path: Path) -> Tensor:
    """Read one IDX file (the MNIST format, optionally gzipped) into a uint8 tensor."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(_("{path} is not an IDX file of unsigned bytes").format(path=path))
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    if len(body) != math.prod(dims):
        raise ValueError(
            _("{path} is truncated: expected {expected} bytes, found {found}").format(
                path=path, expected=math.prod(dims), found=len(body)
            )
        )
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


@cache
def _decoded(files: tuple[tuple[str, Path], ...]) -> dict[str, Tensor]:
    """Return the four files' tensors, labels as int64, decoded once whatever the language
    their origin is told in."""
    tensors = {key: read_idx(path) for key, path in files}
    return {key: t.long() if key.endswith("_labels") else t for key, t in tensors.items()}


def _decode(files: tuple[tuple[str, Path], ...], source: str, is_sample: bool) -> FashionMNIST:
    tensors = _decoded(files)
    unmatched = {
        "train": N_("the train files of {source} do not hold matching 28x28 images"),
        "test": N_("the test files of {source} do not hold matching 28x28 images"),
    }
    for split in ("train", "test"):
        images, labels = tensors[f"{split}_images"], tensors[f"{split}_labels"]
        if images.dim() != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels):
            raise ValueError(_(unmatched[split]).format(source=source))
    folder = dict(files)["train_images"].parent
    return FashionMNIST(
        train_images=tensors["train_images"],
        train_labels=tensors["train_labels"],
        test_images=tensors["test_images"],
        test_labels=tensors["test_labels"],
        source=source,
        folder=folder,
        is_sample=is_sample,
    )


def _download(root: Path) -> dict[str, Path] | None:
    import torchvision

    for train in (True, False):
        torchvision.datasets.FashionMNIST(root=str(root), train=train, download=True)
    return files_in(root / "FashionMNIST" / "raw")


def find_full_set(path: str | Path | None = None) -> tuple[dict[str, Path], str, list[str]]:
    """Look for the full set in the documented order; return its files, origin and tries."""
    tried: list[str] = []
    given = path or settings.FASHION_MNIST.get() or None
    if given:
        folder = Path(given).expanduser()
        for candidate in (folder, folder / "FashionMNIST" / "raw"):
            if found := files_in(candidate):
                return found, _("the folder you gave, {folder}").format(folder=candidate), tried
        tried.append(
            _("the folder you gave, {folder}: the four files are not all there").format(
                folder=folder
            )
        )
    raw = data_root() / "FashionMNIST" / "raw"
    if found := files_in(raw):
        return found, _("torchvision's folder {folder}").format(folder=raw), tried
    tried.append(
        _("torchvision's folder {folder}: not there (set DPLAB_DATA_ROOT to use another)").format(
            folder=raw
        )
    )
    for folder in SYSTEM_DIRS:
        if found := files_in(folder):
            origin = _("the dataset-fashion-mnist package in {folder}").format(folder=folder)
            return found, origin, tried
    tried.append(
        _(
            "{folders}: not there (on Debian or Ubuntu: apt-get install dataset-fashion-mnist)"
        ).format(folders=", ".join(map(str, SYSTEM_DIRS)))
    )
    if settings.OFFLINE.get() not in ("", "0"):
        tried.append(_("a download: skipped because DPLAB_OFFLINE is set"))
    else:
        try:
            if found := _download(data_root()):
                return found, _("a torchvision download into {folder}").format(folder=raw), tried
            tried.append(
                _("a download into {folder}: finished but the files are missing").format(
                    folder=data_root()
                )
            )
        except Exception as error:  # any network or disk failure: report it, don't hide it
            tried.append(
                _("a download into {folder}: failed ({kind}: {error})").format(
                    folder=data_root(), kind=type(error).__name__, error=error
                )
            )
    return {}, "", tried


_announced: set[str] = set()


def _announce(message: str) -> None:
    if message not in _announced:
        _announced.add(message)
        print(message)


def embedded_sample() -> FashionMNIST:
    """Return the sample shipped with the lab (4,000 training and 1,000 test images)."""
    found = files_in(SAMPLE_DIR)
    if found is None:
        raise DataNotFound(
            _("the embedded sample is missing from {folder}; reinstall dplab").format(
                folder=SAMPLE_DIR
            )
        )
    return _decode(tuple(sorted(found.items())), _("the lab's embedded sample"), True)


def fashion_mnist(path: str | Path | None = None, source: str | None = None) -> FashionMNIST:
    """Return the decoded set. `source` is "auto" (full set if found, else the sample),
    "full" (the full set or an error listing what was tried) or "sample"; by default it is
    `$DPLAB_DATA_SOURCE`, else "auto". `$DPLAB_DATA_LIMIT` may keep only its first images."""
    return _limited(_chosen(path, source))


def data_limit() -> tuple[int, int] | None:
    """Return (train, test) from `$DPLAB_DATA_LIMIT` ("TRAIN,TEST"), or None when unset."""
    text = settings.DATA_LIMIT.get().strip()
    if not text:
        return None
    try:
        train, test = (int(part) for part in text.split(","))
    except ValueError:
        train = test = 0
    if train < 1 or test < 1:
        raise ValueError(
            _(
                "DPLAB_DATA_LIMIT must be two whole numbers above zero, TRAIN,TEST (such as "
                "512,256), not {value}: set it so, or unset it to use every image"
            ).format(value=repr(text))
        )
    return train, test


def _limited(data: FashionMNIST) -> FashionMNIST:
    """Keep the first images that `$DPLAB_DATA_LIMIT` allows, saying so once."""
    limit = data_limit()
    if limit is None or (limit[0] >= len(data.train_labels) and limit[1] >= len(data.test_labels)):
        return data
    train, test = limit
    kept = replace(
        data,
        train_images=data.train_images[:train],
        train_labels=data.train_labels[:train],
        test_images=data.test_images[:test],
        test_labels=data.test_labels[:test],
    )
    _announce(
        _(
            "Fashion-MNIST: keeping the first {train} training and {test} test images, as "
            "DPLAB_DATA_LIMIT asks."
        ).format(train=f"{len(kept.train_labels):,}", test=f"{len(kept.test_labels):,}")
    )
    return kept


def _chosen(path: str | Path | None, source: str | None) -> FashionMNIST:
    source = source or settings.DATA_SOURCE.get()
    if source not in ("auto", "full", "sample"):
        raise ValueError(
            _('source must be "auto", "full" or "sample", not {source}').format(source=repr(source))
        )
    tried: list[str] = []
    if source != "sample":
        found, origin, tried = find_full_set(path)
        if found:
            data = _decode(tuple(sorted(found.items())), origin, False)
            _announce(
                _("Fashion-MNIST: {train} training and {test} test images from {origin}.").format(
                    train=f"{len(data.train_images):,}",
                    test=f"{len(data.test_images):,}",
                    origin=origin,
                )
            )
            return data
        if source == "full":
            raise DataNotFound(
                _(
                    "the full Fashion-MNIST set was asked for, but none was found. Tried:\n"
                    "  - {tried}\n"
                    "Give a folder with path=..., or install the dataset-fashion-mnist package."
                ).format(tried="\n  - ".join(tried))
            )
    data = embedded_sample()
    if source == "sample":
        said = _(
            "Fashion-MNIST: using the lab's embedded sample ({train} training and {test} test "
            "images) as asked. Accuracy will be lower than the book's."
        )
    else:
        said = _(
            "Fashion-MNIST: using the lab's embedded sample ({train} training and {test} test "
            "images) because no full copy was found. Accuracy will be lower than the book's."
        )
    _announce(said.format(train=f"{len(data.train_images):,}", test=f"{len(data.test_images):,}"))
    return data


class Batches:
    """Minibatches of (images, labels) cut by index from tensors held in memory.

    Images come out as float32 in [0, 1] with shape (batch, 1, 28, 28), or resized.
    With `shuffle=True` every pass visits the examples in a new order.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        batch_size: int,
        shuffle: bool = False,
        resize: int | tuple[int, int] | None = None,
        seed: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(
                _("batch_size must be at least 1, got {batch_size}").format(batch_size=batch_size)
            )
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle = batch_size, shuffle
        self.resize = (resize, resize) if isinstance(resize, int) else resize
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        n = len(self.labels)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        for start in range(0, n, self.batch_size):
            idx = order[start : start + self.batch_size]
            X = self.images[idx].unsqueeze(1).float().div_(255)
            if self.resize is not None:
                X = F.interpolate(X, size=self.resize, mode="bilinear", align_corners=False)
            yield X, self.labels[idx]


def load_data_fashion_mnist(
    batch_size: int,
    resize: int | tuple[int, int] | None = None,
    *,
    path: str | Path | None = None,
    source: str | None = None,
    subset: tuple[int, int] | None = None,
) -> tuple[Batches, Batches]:
    """Return (train_iter, test_iter) over Fashion-MNIST; train batches are reshuffled each pass.

    `subset=(n_train, n_test)` keeps only the first examples, for quick runs on a CPU.
    """
    data = fashion_mnist(path, source)
    n_train, n_test = subset or (len(data.train_labels), len(data.test_labels))
    train_iter = Batches(
        data.train_images[:n_train], data.train_labels[:n_train], batch_size, True, resize
    )
    test_iter = Batches(
        data.test_images[:n_test], data.test_labels[:n_test], batch_size, False, resize
    )
    return train_iter, test_iter


def fashion_mnist_datasets(
    resize: int | tuple[int, int] | None = None,
    *,
    path: str | Path | None = None,
    source: str | None = None,
    subset: tuple[int, int] | None = None,
) -> tuple["torch.utils.data.TensorDataset", "torch.utils.data.TensorDataset"]:
    """Return (train_set, test_set): Fashion-MNIST as datasets of (image, label) pairs, images
    float32 in [0, 1] of shape (1, 28, 28) (or resized), for a `DataLoader` with a sampler
    such as `DistributedSampler`. `subset=(n_train, n_test)` keeps only the first examples."""
    from torch.utils.data import TensorDataset

    data = fashion_mnist(path, source)
    n_train, n_test = subset or (len(data.train_labels), len(data.test_labels))
    sets = []
    for images, labels in (
        (data.train_images[:n_train], data.train_labels[:n_train]),
        (data.test_images[:n_test], data.test_labels[:n_test]),
    ):
        X = images.unsqueeze(1).float().div_(255)
        if resize is not None:
            size = (resize, resize) if isinstance(resize, int) else resize
            X = F.interpolate(X, size=size, mode="bilinear", align_corners=False)
        sets.append(TensorDataset(X, labels.clone()))
    return sets[0], sets[1]


def torchvision_root(data: FashionMNIST) -> Path:
    """Return a root under which torchvision finds `data` as decompressed `FashionMNIST/raw` files.

    torchvision checks the MD5 of `.gz` files and downloads again when they differ (the
    Debian package re-compressed them), but it trusts decompressed files, so write those.
    """
    if data.folder.name == "raw" and data.folder.parent.name == "FashionMNIST":
        if all((data.folder / name).is_file() for name in FILES.values()):
            return data.folder.parent.parent
    root = data_root() / ("sample" if data.is_sample else "decompressed")
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in FILES.values():
        target = raw / name
        if not target.is_file():
            source = files_in(data.folder)
            key = next(k for k, v in FILES.items() if v == name)
            path = source[key]
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rb") as f:
                target.write_bytes(f.read())
    return root


def load_data_fashion_mnist_book(
    batch_size: int,
    resize: int | None = None,
    *,
    path: str | Path | None = None,
    source: str | None = None,
    num_workers: int = 4,
) -> tuple["torch.utils.data.DataLoader", "torch.utils.data.DataLoader"]:
    """Return the book's pipeline: torchvision datasets decoded image by image in a DataLoader."""
    import torchvision
    from torch.utils import data as tud
    from torchvision import transforms

    root = torchvision_root(fashion_mnist(path, source))
    steps = [transforms.ToTensor()]
    if resize:
        steps.insert(0, transforms.Resize(resize))
    trans = transforms.Compose(steps)
    train = torchvision.datasets.FashionMNIST(
        str(root), train=True, transform=trans, download=False
    )
    test = torchvision.datasets.FashionMNIST(
        str(root), train=False, transform=trans, download=False
    )
    return (
        tud.DataLoader(train, batch_size, shuffle=True, num_workers=num_workers),
        tud.DataLoader(test, batch_size, shuffle=False, num_workers=num_workers),
    )


def get_fashion_mnist_labels(labels: Tensor | list[int]) -> list[str]:
    """Return the text names of numeric Fashion-MNIST labels."""
    return [TEXT_LABELS[int(i)] for i in labels]
