"""What the fast path's fork server imports and prepares once, so that each child it forks
starts warm: the imports, pyplot, garbage collection held off, and huge pages for what was
imported; and the environment it runs in."""

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from grader.sandbox.fence import WAIT_POLICY, with_import_path


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """Import without the cyclic garbage collector, then freeze what was imported.

    Importing torch and the rest makes some 600,000 objects; the collector ran over them
    again and again as they came, a fifth of the time the imports took (0.5 s of 2.7 s).
    Frozen, they are never looked at again, here or in a forked child or rank: a child's
    collections go only over what it made itself, and do not write to (and so copy) the pages
    it shares with the server. What the imports left as garbage (a few thousand objects)
    stays frozen too; collecting it first would cost 0.2 s."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def preload() -> None:
    """Import what every child needs, so that a child starts with it already there.
    (Not torchvision: 1.3 s to import, and only reading the real Fashion-MNIST needs it.)"""
    with uncollected():
        _preload()


# What every child needs, imported once by the server: torch; torch.distributed.tensor, which
# a tensor subclass's first operation imports (0.7 s: the lab's stand-in devices); the lab; the
# child's own code; and, below, every public checks module.
PRELOADED = (
    "torch",
    "torch.distributed.tensor",
    "dplab.data",
    "dplab.distributed",
    "grader.base.inputs",
    "grader.sandbox.child",
)


def _preload() -> None:
    import importlib

    from grader.manifest import load_manifest

    for name in PRELOADED:
        importlib.import_module(name)
    for ex in load_manifest().exercises:
        importlib.import_module(ex.checks)
    sys.modules["dplab.data"].embedded_sample()  # decoded once: notebooks load it, and the checks
    from grader.ranks.plugins import look_up_backend_plugins

    look_up_backend_plugins()  # once for every process group of every child


def the_rest() -> list[Callable[[], None]]:
    """Return the steps that import what only some children need, last first: once the
    server is ready, it takes them one at a time while it has nothing to do (a grader that
    comes meanwhile waits for one step, not for all), or all before it forks a child that
    asks for everything (see `serve`). They are a child's own imports before it forks ranks
    (grader.sandbox.child.LATER_IMPORTS), done here with the collector held off."""

    def uncollected_step(step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with uncollected():
                step()

        return run

    from grader.sandbox.child import LATER_IMPORTS  # (imported by the server already)

    return [uncollected_step(step) for step in LATER_IMPORTS]


def pyplot() -> None:
    """Import pyplot, for the children of later sessions: the warm server takes this step
    while it waits. A child forked without it imports pyplot when first used, as most never
    draw (grader.load.notebook); a session forks complete children without waiting for it."""
    with uncollected():
        import matplotlib.pyplot  # (0.2 s, and it builds the font cache once)

        # Each rank switches pyplot to Agg at each run (dplab.distributed): the first switch
        # imports the backend (8 ms), in every rank of every grade but for this.
        matplotlib.pyplot.switch_backend("Agg")


HUGE_PAGE = 2 << 20


def huge_pages(seconds: float = 0.02) -> Callable[[], bool]:
    """Return a step that asks Linux to back this process's larger writable anonymous
    regions (as they are at the first step) with 2 MiB pages (transparent huge pages,
    MADV_COLLAPSE), 8 MiB at a time for about `seconds`; each step returns True once all is
    asked for. A fork copies a page table entry per page: after `import torch` some 400 MB of
    such memory makes each fork and exit of a child or a rank cost 19 ms of processor time,
    and 7 ms once collapsed. Does nothing where the system cannot (another OS, an older
    kernel, huge pages off)."""
    left: list[tuple[int, int]] | None = None
    madvise = None

    def regions() -> list[tuple[int, int]]:
        if not sys.platform.startswith("linux"):
            return []
        try:
            with open("/proc/self/maps") as f:
                maps = [line.split() for line in f]
        except OSError:
            return []
        found = []
        for fields in maps:
            if "w" not in fields[1] or (len(fields) > 5 and fields[5] != "[heap]"):
                continue  # only the heap and unnamed private memory
            low, high = (int(x, 16) for x in fields[0].split("-"))
            low, high = -(-low // HUGE_PAGE) * HUGE_PAGE, high // HUGE_PAGE * HUGE_PAGE
            found += [(a, min(high, a + 4 * HUGE_PAGE)) for a in range(low, high, 4 * HUGE_PAGE)]
        return found

    def step() -> bool:
        import ctypes

        nonlocal left, madvise
        if left is None:
            try:
                madvise = ctypes.CDLL(None, use_errno=True).madvise
                left = regions()
            except (OSError, AttributeError):
                left = []
        hugepage, collapse = 14, 25  # MADV_HUGEPAGE, MADV_COLLAPSE
        until = time.monotonic() + seconds
        while left and time.monotonic() < until:
            low, high = left.pop()
            if madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), hugepage) == 0:
                madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), collapse)
        return not left

    return step


def server_environment(folder: Path) -> dict[str, str]:
    """Return the fork server's environment (each child gets its own in its request)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADER_", "JUPYTER"))}
    with_import_path(env)
    env.update(
        MPLBACKEND="Agg",
        MPLCONFIGDIR=str(folder / "matplotlib"),
        DPLAB_OFFLINE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTORCH_NVML_BASED_CUDA_CHECK="1",  # CUDA checks that never initialise CUDA
    )
    env.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    return env
