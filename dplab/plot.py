"""`Animator`: a line plot that grows while a model trains.

In JupyterLab the plot redraws under the cell. Anywhere else (a script, a grader, a test)
it is saved as a PNG file instead, because there is no screen to draw on.
"""

import io
import re
import sys
from pathlib import Path

from dplab import settings
from labtext import _

# Set in a process forked from the kernel (dplab.distributed): it must not draw in the
# notebook, whose connection belongs to the kernel; its plots are saved as files instead.
HEADLESS = False


def _in_notebook() -> bool:
    """Return True when running inside a Jupyter kernel (and drawing there)."""
    if HEADLESS or "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def figure_path(name: str) -> Path:
    """Return where a headless plot called `name` is saved: `$DPLAB_FIGURE_DIR`, else here."""
    folder = Path(settings.FIGURE_DIR.get())
    safe = re.sub(r"[^\w.-]+", "-", name).strip("-") or "plot"  # (\w: Chinese names too)
    return folder / f"{safe}.png"


# Fonts with Chinese glyphs, as Debian installs them (the lab's image has the first).
CHINESE_FONTS = (
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
)
# Fonts with Chinese glyphs that macOS and Windows have, and others matplotlib may have found
CHINESE_FAMILIES = (
    "Noto Sans CJK SC",
    "Source Han Sans SC",
    "PingFang SC",
    "Heiti SC",
    "STHeiti",
    "Microsoft YaHei",
    "SimHei",
)


def chinese_fonts() -> list[str]:
    """Let plots show Chinese labels: put the installed fonts with Chinese glyphs behind
    matplotlib's own, which it falls back on for a glyph its font lacks (added by file, as
    matplotlib's cache of fonts does not see fonts installed after it was made). Return
    their names: none where no such font is installed (the labels then show boxes)."""
    import matplotlib
    from matplotlib import font_manager

    names = []
    for path in CHINESE_FONTS:
        if Path(path).is_file():
            font_manager.fontManager.addfont(path)
            names.append(font_manager.FontProperties(fname=path).get_name())
    known = {font.name for font in font_manager.fontManager.ttflist}
    names += [name for name in CHINESE_FAMILIES if name in known and name not in names]
    family = list(matplotlib.rcParams["font.family"])
    matplotlib.rcParams["font.family"] = family + [n for n in names if n not in family]
    return names


class Animator:
    """Plot one or more series point by point, as the book's `d2l.Animator` does."""

    def __init__(
        self,
        xlabel: str | None = None,
        ylabel: str | None = None,
        legend: list[str] | None = None,
        xlim: list[float] | None = None,
        ylim: list[float] | None = None,
        xscale: str = "linear",
        yscale: str = "linear",
        fmts: tuple[str, ...] = ("-", "m--", "g-.", "r:"),
        figsize: tuple[float, float] = (3.5, 2.5),
        save_to: str | Path | None = None,
    ) -> None:
        self.figsize = figsize
        self._fig = self._axes = None  # made at the first draw (see `fig`)
        self.xlabel, self.ylabel, self.legend = xlabel, ylabel, legend or []
        self.xlim, self.ylim, self.xscale, self.yscale = xlim, ylim, xscale, yscale
        self.fmts = fmts
        self.X: list[list[float]] | None = None
        self.Y: list[list[float]] | None = None
        self.inline = _in_notebook()
        self._warned = False
        self.path = Path(save_to) if save_to else figure_path(ylabel or "animator")
        self._handle = None

    @property
    def fig(self):
        """The matplotlib Figure, made when first needed: making one takes some 30 ms, and
        an Animator that never draws (a grader's, say) need not pay for it."""
        if self._fig is None:
            from matplotlib.figure import Figure

            chinese_fonts()
            self._fig = Figure(figsize=self.figsize)
            self._axes = self._fig.add_subplot()
        return self._fig

    @fig.setter
    def fig(self, value) -> None:
        self._fig = value

    @property
    def axes(self):
        """The Axes the series are drawn on (made with the figure)."""
        if self._axes is None:
            figure = self.fig
            self._axes = figure.axes[0] if figure.axes else figure.add_subplot()
        return self._axes

    @axes.setter
    def axes(self, value) -> None:
        self._axes = value

    def add(self, x: float | list[float], y: float | list[float] | tuple[float, ...]) -> None:
        """Append the point(s) `y` at `x` and redraw."""
        ys = list(y) if isinstance(y, list | tuple) else [y]
        xs = list(x) if isinstance(x, list | tuple) else [x] * len(ys)
        if self.X is None:
            self.X = [[] for _y in ys]
            self.Y = [[] for _y in ys]
        for i, (a, b) in enumerate(zip(xs, ys, strict=True)):
            if a is not None and b is not None:
                self.X[i].append(float(a))
                self.Y[i].append(float(b))
        self._draw()

    def _draw(self) -> None:
        ax = self.axes
        ax.cla()
        for xs, ys, fmt in zip(self.X, self.Y, self.fmts, strict=False):
            ax.plot(xs, ys, fmt)
        ax.set_xlabel(self.xlabel or "")
        ax.set_ylabel(self.ylabel or "")
        ax.set_xscale(self.xscale)
        ax.set_yscale(self.yscale)
        if self.xlim:
            low, high = self.xlim
            if low == high:  # one epoch (xlim=[1, num_epochs]): a unit around it, no warning
                low, high = low - 0.5, high + 0.5
            ax.set_xlim(low, high)
        if self.ylim:
            ax.set_ylim(self.ylim)
        if self.legend:
            ax.legend(self.legend)
        ax.grid(True)
        self.fig.tight_layout()
        if self.inline:
            self._show_inline()
        else:
            self._save()

    def _save(self) -> None:
        """Save the figure; where that is refused, say so once and let the training go on."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fig.savefig(self.path)
        except OSError as error:
            if not self._warned:
                self._warned = True
                print(
                    _(
                        "dplab: cannot save the plot to {path} ({why}); set DPLAB_FIGURE_DIR "
                        "to a folder you may write to"
                    ).format(path=self.path, why=error.strerror),
                    file=sys.stderr,
                )

    def _show_inline(self) -> None:
        from IPython.display import Image, display

        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png")
        image = Image(data=buffer.getvalue(), format="png")
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)
