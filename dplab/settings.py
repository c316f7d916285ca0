"""The runtime's settings, read from the environment: every `DPLAB_*` variable the lab reads
is here, with its default and what it does (docs/settings.md lists them)."""

from labtext.settings import Setting

DEVICES = Setting(
    "DPLAB_DEVICES",
    "auto",
    "which devices the lab trains on: auto (two or more GPUs as they are, else stand-ins), "
    "real (GPUs only, the CPU where one is missing), stand-in, or cpu",
)
STAND_INS = Setting("DPLAB_STAND_INS", "2", "how many stand-in devices there are")
FIGURE_DIR = Setting(
    "DPLAB_FIGURE_DIR", ".", "where plots go when there is no notebook to show them in"
)
DATA_ROOT = Setting(
    "DPLAB_DATA_ROOT", "~/.cache/dplab", "where Fashion-MNIST is looked for and downloaded"
)
FASHION_MNIST = Setting(
    "DPLAB_FASHION_MNIST", "", "a folder that holds Fashion-MNIST's four .gz files, used as is"
)
OFFLINE = Setting("DPLAB_OFFLINE", "", "1: never download; use what is installed, or the sample")
DATA_LIMIT = Setting(
    "DPLAB_DATA_LIMIT", "", "TRAIN,TEST: keep only the first images of each split (quick runs)"
)
DATA_SOURCE = Setting(
    "DPLAB_DATA_SOURCE", "auto", "auto (the full set where installed), full, or sample"
)

ALL = (DEVICES, STAND_INS, FIGURE_DIR, DATA_ROOT, FASHION_MNIST, OFFLINE, DATA_LIMIT, DATA_SOURCE)
