"""The Chinese notebooks' plots show their labels: a font with the glyphs is found and used,
not boxes in place of missing glyphs."""

import warnings
from pathlib import Path

import pytest
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ft2font import FT2Font

from dplab.plot import CHINESE_FONTS, Animator, chinese_fonts

LABEL = "测试精度，迭代周期"

pytestmark = pytest.mark.skipif(
    not any(Path(p).is_file() for p in CHINESE_FONTS),
    reason="no font with Chinese glyphs here (Debian: fonts-wqy-microhei; the lab's image has it)",
)


def test_the_font_that_draws_a_chinese_label_has_its_glyphs(tmp_path):
    assert chinese_fonts()
    figure = Figure()
    axes = figure.add_subplot()
    axes.set_ylabel(LABEL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph ... missing from font(s)" would fail here
        FigureCanvasAgg(figure).draw()
    used = font_manager.fontManager._find_fonts_by_props(axes.yaxis.label.get_fontproperties())
    holding = [
        path for path in used if all(FT2Font(path).get_char_index(ord(c)) for c in "测试精度")
    ]
    assert holding, f"none of the fonts used has the glyphs: {used}"


def test_an_animator_with_chinese_labels_saves_a_plot_named_in_chinese(tmp_path, monkeypatch):
    monkeypatch.setenv("DPLAB_FIGURE_DIR", str(tmp_path))
    animator = Animator("迭代周期", "测试精度", xlim=[1, 3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in range(3):
            animator.add(epoch + 1, (0.5 + 0.1 * epoch,))
    assert (tmp_path / "测试精度.png").is_file()
