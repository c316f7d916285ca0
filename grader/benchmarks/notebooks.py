"""`make bench-notebooks`: time each reference notebook run end to end, as a student runs it.

    python -m grader.benchmarks.notebooks

Each notebook of the manifest runs from `solutions/` in a fresh Jupyter kernel, on two
stand-in devices (or the real GPUs) and the embedded Fashion-MNIST sample; the seconds are
printed. The tests run the same notebooks and check their outputs, never their time.
"""

import os
import tempfile
import time

import nbformat
from nbclient import NotebookClient

from grader import settings
from grader.manifest import load_manifest, solutions_dir


def run_notebook(name: str, folder: str) -> float:
    """Run the reference notebook `name` in a fresh kernel in `folder`; return the seconds."""
    nb = nbformat.read(solutions_dir() / name, as_version=4)
    started = time.perf_counter()
    NotebookClient(
        nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": folder}}
    ).execute()
    return time.perf_counter() - started


def main() -> None:
    os.environ.update(DPLAB_DATA_SOURCE="sample", DPLAB_OFFLINE="1", MPLBACKEND="Agg")
    os.environ.setdefault("DPLAB_STAND_INS", "2")
    for name in load_manifest().notebooks:
        with tempfile.TemporaryDirectory() as folder:
            os.environ[settings.FIGURE_DIR.name] = folder
            print(f"{name}: {run_notebook(name, folder):.1f} s end to end", flush=True)


if __name__ == "__main__":
    main()
