"""Draw the README's picture: a check cell in the lab, and what it prints for a real mistake.

    make picture        (or .venv/bin/python docs/make_picture.py)

The picture is drawn from a real run, not typed in. The script takes the released from-scratch
notebook, writes a catalogued mistake into the `allreduce` cell as a student would
(`rebinds_list_entries` in grader/exercises/allreduce/private/mistakes.py), and runs in a
Jupyter kernel, as JupyterLab does, the notebook's first cell, that cell, the demo under it and
its check cell. Then it draws the `allreduce` cell and the check cell with its output, laid out
as JupyterLab shows them, into docs/check-in-the-lab.png (a screenshot would need a browser;
this needs only the lab's own packages). Run it again whenever the checks print something new.
"""

import os
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "check-in-the-lab.png"
NOTEBOOK = REPO / "exercises" / "multigpu" / "from_scratch.ipynb"
EXERCISE, MISTAKE = "allreduce", "rebinds_list_entries"
STUB = (
    "    # YOUR CODE HERE\n    raise NotImplementedError('write this function, then run its check')"
)
COLUMNS = 100  # where JupyterLab's output area wraps long lines, in this picture

# JupyterLab's light theme
INPUT_PROMPT, OUTPUT_PROMPT = "#307fc1", "#bf5b3d"
CELL_BACKGROUND, CELL_BORDER = "#f7f7f7", "#e0e0e0"
TEXT = "#212121"
SYNTAX = {  # pygments token type -> (colour, bold), as JupyterLab's CodeMirror theme colours
    "Keyword": ("#008000", True),
    "Name.Builtin": ("#008000", False),
    "Name.Function": ("#0000ff", False),
    "Literal.String": ("#ba2121", False),
    "Literal.Number": ("#008000", False),
    "Operator": ("#aa22ff", False),
    "Comment": ("#408080", False),
}


def run_cells() -> tuple[list[tuple[int, str]], str, str]:
    """Run the notebook's first code cell, the mistaken allreduce, the demo under it and its
    check cell in a kernel; return the allreduce cell and the check cell (each with its
    execution count), what the check cell printed and the Markdown of its result."""
    import nbformat
    from nbclient import NotebookClient

    sys.path.insert(0, str(REPO))
    from grader.exercises.catalogue import mistakes_of
    from grader.manifest import load_manifest

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in code]
    solution = ids.index(f"{EXERCISE}-solution")
    checks = ids.index(f"{EXERCISE}-checks")
    mistake = mistakes_of(load_manifest().exercise(EXERCISE))[MISTAKE].source.strip()
    body = mistake.split("\n", 1)[1]  # the student keeps the stub's `def` line and docstring
    assert STUB in code[solution].source, "the stub changed: update STUB"
    code[solution].source = code[solution].source.replace(STUB, body)
    nb.cells = [code[0], *code[solution : checks + 1]]  # the demo prints the lab's first line
    os.environ.update(DPLAB_OFFLINE="1", MPLBACKEND="Agg")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    with tempfile.TemporaryDirectory() as scratch:
        NotebookClient(nb, timeout=600, resources={"metadata": {"path": scratch}}).execute()
    shown = [(c.execution_count, c.source) for c in (nb.cells[1], nb.cells[-1])]
    outputs = nb.cells[-1].outputs
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    result = next(o for o in outputs if o.output_type == "execute_result")
    return shown, printed, result.data["text/markdown"]


def draw(cells: list[tuple[int, str]], printed: str, points: str) -> None:
    """Draw the code cells, then the last one's output: what it printed, as JupyterLab shows
    a stream (in one colour, long lines wrapped at the area's edge), then its result."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
    from pygments.lexers import PythonLexer

    size = 10.0  # points
    mono, sans = "DejaVu Sans Mono", "DejaVu Sans"
    advance = 0.602 * size / 72  # the width of one character of DejaVu Sans Mono, in inches
    line, gap = 1.45 * size / 72, 0.12
    margin, pad = 0.18, 0.09
    left = margin + 7 * advance  # where the cells start, right of the prompts
    right = left + COLUMNS * advance + 2 * pad  # where they end
    width = right + margin

    report = []
    for text in printed.rstrip("\n").split("\n"):  # pre-wrap: a long line goes on at the edge
        report += textwrap.wrap(text, COLUMNS) or [""]  # keeps the indentation
    lines = [source.split("\n") for _, source in cells]
    height = (
        2 * margin
        + sum(len(c) * line + 2 * pad + gap for c in lines)
        + len(report) * line
        + gap
        + 3 * line  # the cell's result, in at most two lines
    )
    fig = Figure(figsize=(width, height), dpi=110, facecolor="white")
    renderer = FigureCanvasAgg(fig).get_renderer()
    y = height - margin  # the top of what comes next, in inches from the bottom

    def text(x, y, s, colour=TEXT, bold=False, family=mono):
        return fig.text(
            x, y, s, transform=fig.dpi_scale_trans, family=family, size=size, color=colour,
            weight="bold" if bold else "normal", va="baseline",
        )  # fmt: skip

    def inches(drawn) -> float:
        return drawn.get_window_extent(renderer).width / fig.dpi

    for (number, _), source in zip(cells, lines, strict=True):
        box = len(source) * line + 2 * pad
        fig.patches.append(
            Rectangle(
                (left, y - box), right - left, box, transform=fig.dpi_scale_trans,
                facecolor=CELL_BACKGROUND, edgecolor=CELL_BORDER, linewidth=0.8,
            )
        )  # fmt: skip
        text(margin, y - pad - 0.78 * line, f"[{number}]:", INPUT_PROMPT)
        row, column = 0, 0
        for kind, value in PythonLexer().get_tokens("\n".join(source)):
            colour, bold = next(
                (style for name, style in SYNTAX.items() if str(kind).startswith(f"Token.{name}")),
                (TEXT, False),
            )
            for i, part in enumerate(value.split("\n")):
                if i:
                    row, column = row + 1, 0
                if part.strip():
                    text(
                        left + pad + column * advance,
                        y - pad - (row + 0.78) * line,
                        part,
                        colour,
                        bold,
                    )
                column += len(part)
        y -= box + gap

    for i, s in enumerate(report):
        text(left + pad, y - (i + 0.78) * line, s)
    y -= len(report) * line + gap

    # The cell's result, which JupyterLab renders from its Markdown: "**6 of 9 points** ..."
    baseline = y - 0.9 * line
    text(margin, baseline, f"[{cells[-1][0]}]:", OUTPUT_PROMPT)
    _, strong, rest = points.split("**", 2)
    probes = [text(0, 0, s, family=sans) for s in ("a a", "aa")]
    space = inches(probes[0]) - inches(probes[1])
    for probe in probes:
        probe.remove()
    x = left + pad + inches(text(left + pad, baseline, strong, TEXT, True, sans)) + space
    for word in rest.split():
        drawn = text(x, baseline, word, TEXT, False, sans)
        if x + inches(drawn) > right - pad:  # wrap at the output area's edge
            drawn.remove()
            x, baseline = left + pad, baseline - line
            drawn = text(x, baseline, word, TEXT, False, sans)
        x += inches(drawn) + space
    fig.savefig(OUT, dpi=fig.dpi, metadata={"Software": None})
    from PIL import Image, ImageOps  # matplotlib's own dependency

    with Image.open(OUT) as image:
        image = image.convert("RGB")
    bottom = ImageOps.invert(image.convert("L")).getbbox()[3]  # the result took fewer lines
    image = image.crop((0, 0, image.width, min(image.height, bottom + int(margin * fig.dpi))))
    image.quantize(256).save(OUT, optimize=True)  # 256 colours are plenty: a third of the bytes


def main() -> None:
    draw(*run_cells())
    print(f"wrote {OUT.relative_to(REPO)} ({OUT.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
