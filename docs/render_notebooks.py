"""Run a language's reference notebooks end to end and export them as HTML, to look at.

    make render LANG=zh_CN      (or .venv/bin/python docs/render_notebooks.py zh_CN)

Each reference notebook of the language (solutions/ for English, the translated ones that
`python -m grader translate` writes for another) runs in a Jupyter kernel, on the CPU with
two stand-in devices and the first images of the embedded Fashion-MNIST sample, the way
tests/test_notebook_runs.py runs them. What comes out is build/render/<language>/: each
notebook with its outputs (`.ipynb` and `.html`, the plots inside), and the plots as PNG
files, so that a reader can see the demos' lines, the check cells' reports and the plots'
labels in that language. It takes a few minutes; nothing tests it.
"""

import base64
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {
    "DPLAB_DATA_SOURCE": "sample",
    "DPLAB_DATA_LIMIT": "512,256",
    "DPLAB_OFFLINE": "1",
    "DPLAB_STAND_INS": "2",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
}


def sources(language: str, scratch: Path) -> list[Path]:
    """Return the reference notebooks in `language` (written into `scratch` if translated)."""
    sys.path.insert(0, str(REPO))
    from grader.manifest import load_manifest, solutions_dir

    names = load_manifest().notebooks
    if language == "en":
        return [solutions_dir() / name for name in names]
    from grader.tools.translate import write_edition

    written = {p.name: p for p in write_edition(language, scratch)}
    return [written[name] for name in names]


def render(language: str) -> list[Path]:
    """Run and export each notebook of `language`; return the files written."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    out = REPO / "build" / "render" / language
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.update(ENV, DPLAB_FIGURE_DIR=scratch, LAB_LANG=language)
        for path in sources(language, Path(scratch)):
            print(f"running {path.name} ({language}) ...", flush=True)
            nb = nbformat.read(path, as_version=4)
            client = NotebookClient(
                nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": scratch}}
            )
            client.execute()
            stem = out / path.stem
            nbformat.write(nb, stem.with_suffix(".ipynb"))
            html, _ = HTMLExporter().from_notebook_node(nb)
            stem.with_suffix(".html").write_text(html, encoding="utf-8")
            written += [stem.with_suffix(".ipynb"), stem.with_suffix(".html")]
            pictures = [
                o["data"]["image/png"]
                for c in nb.cells
                for o in c.get("outputs", [])
                if "image/png" in o.get("data", {})
            ]
            for i, picture in enumerate(pictures):
                png = out / f"{path.stem}-{i}.png"
                png.write_bytes(base64.b64decode(picture))
                written.append(png)
        for figure in sorted(Path(scratch).glob("*.png")):  # the plots saved by dplab.plot
            (out / figure.name).write_bytes(figure.read_bytes())
            written.append(out / figure.name)
    return written


if __name__ == "__main__":
    for written in render(sys.argv[1] if len(sys.argv) > 1 else "zh_CN"):
        print(f"wrote {written.relative_to(REPO)}")
