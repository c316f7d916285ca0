"""Loading a notebook as students really write them, without running their training."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dplab
from grader.load.notebook import NotebookError, load_notebook
from tests.conftest import write_notebook

TRAINING = frozenset({"train"})

# Shaped like the seed notes: the book's import, demos that print, a final training call.
SEED_LIKE = [
    "%matplotlib inline\nimport torch\nfrom torch import nn\nfrom torch.nn import functional as F\n"
    "from d2l import torch as d2l",
    "calls = []\nscale = 0.01\nparams = d2l.lenet_params(scale)\nloss = nn.CrossEntropyLoss(reduction='none')",
    "def allreduce(data):\n    for i in range(1, len(data)):\n        data[0][:] += data[i].to(data[0].device)\n"
    "    for i in range(1, len(data)):\n        data[i][:] = data[0].to(data[i].device)",
    "data = [torch.ones((1, 2), device=d2l.try_gpu(i)) * (i + 1) for i in range(2)]\n"
    "print('before', data)\nallreduce(data)\nprint('after', data)",
    # a demo that fails on any machine (20 values are no 4 x 6), stand-ins or GPUs
    "split = nn.parallel.scatter(torch.arange(20).reshape(4, 6), [torch.device('cuda:0'), torch.device('cuda:1')])",
    "def broken(:\n    pass",
    "def train(num_gpus, batch_size, lr):\n    calls.append((num_gpus, batch_size, lr))\n    time.sleep(60)",
    "import time\ntrain(num_gpus=2, batch_size=256, lr=0.2)",
    "if __name__ == '__main__':\n    train(2, 256, 0.2)",
    "!pip install d2l==0.17.6",
]


@pytest.fixture
def seed_like(tmp_path):
    return load_notebook(write_notebook(tmp_path / "notes.ipynb", *SEED_LIKE), TRAINING)


def test_book_import_gives_the_lab_helpers(seed_like):
    assert seed_like.namespace["d2l"] is dplab


def test_top_level_training_calls_are_not_run(tmp_path):
    loaded = load_notebook(write_notebook(tmp_path / "notes.ipynb", *SEED_LIKE), TRAINING)
    assert loaded.namespace["calls"] == []
    skipped = [n for n in loaded.notes if n.kind == "call-skipped"]
    assert all("did not run this call of train(...)" in n.text for n in skipped)
    assert len(skipped) == 2  # the plain call and the one under `if __name__ == '__main__'`


def test_definitions_and_demos_load(seed_like):
    data = seed_like.namespace["data"]
    assert [t.tolist() for t in data] == [[[3.0, 3.0]], [[3.0, 3.0]]]
    assert callable(seed_like.namespace["allreduce"])


def test_a_failing_statement_is_noted_and_loading_goes_on(seed_like):
    failed = [n for n in seed_like.notes if n.kind == "raised"]
    cell = failed[0].cell
    assert (cell.kind, cell.name) == ("first line", "split = nn.parallel.scatter(torch.ara...")
    assert cell.in_english() == "cell `split = nn.parallel.scatter(torch.ara...`"
    assert failed[0].text.startswith("cell `split = nn.parallel.scatter(torch.ara...`, line 1")
    assert callable(seed_like.namespace["train"])  # defined in a later cell


def test_a_syntax_error_costs_only_its_own_cell(seed_like):
    (syntax,) = [n for n in seed_like.notes if n.kind == "syntax"]
    assert syntax.text.startswith("cell `def broken(:`: syntax error on line 1")
    assert "broken" not in seed_like.namespace
    assert "train" in seed_like.namespace


def test_shell_lines_and_magics_are_dropped(seed_like):
    assert not any("pip" in n.text for n in seed_like.notes)


def test_a_line_that_continues_a_statement_is_code_even_when_it_starts_with_percent(tmp_path):
    """A `%`-format split over two lines, as notes written for the book's first edition
    print each epoch: the second line is code, not a magic (IPython reads magics only
    where a statement starts); a magic inside a block is still dropped."""
    loaded = load_notebook(
        write_notebook(
            tmp_path / "n.ipynb",
            "%matplotlib inline\n"
            "def report(epoch, acc):\n"
            "    %time pass\n"
            "    return ('epoch %d, acc %.2f'\n"
            "            % (epoch, acc))",
            "said = report(3, 0.5)",
        )
    )
    assert loaded.notes == []
    assert loaded.namespace["said"] == "epoch 3, acc 0.50"


def test_check_cells_are_not_run(tmp_path):
    loaded = load_notebook(
        write_notebook(
            tmp_path / "n.ipynb",
            "def check(*a):\n    raise SystemExit(3)",
            "check('allreduce', print)",
        )
    )
    assert loaded.notes == []


def test_sys_exit_at_top_level_is_survived(tmp_path):
    loaded = load_notebook(write_notebook(tmp_path / "n.ipynb", "import sys\nsys.exit(0)", "x = 1"))
    assert loaded.namespace["x"] == 1
    assert any(n.kind == "raised" and "SystemExit" in n.text for n in loaded.notes)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "is not valid JSON"),
        ('{"cells": 3}', "is JSON but not a notebook"),
    ],
)
def test_unreadable_notebooks_are_explained(tmp_path, text, says):
    path = tmp_path / "bad.ipynb"
    path.write_text(text)
    with pytest.raises(NotebookError, match=says):
        load_notebook(path)


def test_a_missing_notebook_is_explained(tmp_path):
    with pytest.raises(NotebookError, match="does not exist"):
        load_notebook(tmp_path / "nothing.ipynb")


def test_code_cells_only(tmp_path):
    path = write_notebook(tmp_path / "n.ipynb", "#md # Title\n\nsome `code`", "y = 2")
    assert json.loads(path.read_text())["cells"][0]["cell_type"] == "markdown"
    assert load_notebook(path).namespace["y"] == 2


# Loads a notebook (NOTEBOOK, or the reference's distributed notebook) and says whether pyplot
# had run its code after loading, then what its `draw` made, then whether pyplot had run.
PYPLOT_PROBE = """
import sys
from grader.load.notebook import load_notebook
from grader.load.reference import reference
if NOTEBOOK:
    names = load_notebook(NOTEBOOK, frozenset()).namespace
else:
    names = dict(reference('distributed.ipynb'), draw=lambda: plt.figure())
    plt = names['plt']
print('matplotlib.figure' in sys.modules, type(names['draw']()).__name__,
      'matplotlib.figure' in sys.modules)
"""


@pytest.mark.parametrize(
    ("what", "after_loading"),
    [("no drawing", "False"), ("drawing at load", "True"), ("the reference", "False")],
)
def test_pyplot_runs_its_code_only_once_something_draws(tmp_path, what, after_loading):
    """Neither the checks nor the grader's process draw: the pyplot a notebook (or the
    reference, loaded to judge) imports runs its code, half a second, only once something
    draws, and then works as usual."""
    cells = ["from matplotlib import pyplot as plt", "def draw():\n    return plt.figure()"]
    if what == "drawing at load":
        cells.append("shown = plt.plot([1, 2], [3, 4])")
    notebook = write_notebook(tmp_path / "n.ipynb", *cells) if what != "the reference" else None
    done = subprocess.run(
        [sys.executable, "-c", PYPLOT_PROBE.replace("NOTEBOOK", repr(notebook and str(notebook)))],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [after_loading, "Figure", "True"]


def test_notes_name_cells_as_jupyterlab_shows_them(tmp_path):
    """JupyterLab shows no cell numbers: a note names a cell by its grade id, else by the
    function it defines, else by its first line (issue 31)."""
    path = write_notebook(
        tmp_path / "labels.ipynb", "def helper():\n    return 1 / 0", "helper()", "x = 1 / 0"
    )
    nb = json.loads(path.read_text())
    nb["cells"][2]["metadata"]["nbgrader"] = {"grade_id": "allreduce-solution", "solution": True}
    path.write_text(json.dumps(nb))
    notes = [n.text for n in load_notebook(path).notes]
    assert notes == [
        "cell `helper()`, line 1: raised ZeroDivisionError: division by zero (loading went on)",
        "cell `allreduce-solution`, line 1: raised ZeroDivisionError: division by zero "
        "(loading went on)",
    ]
    assert not any("code cell" in n for n in notes)


def test_a_notebook_that_defines_only_the_exercises_class_is_the_labs(tmp_path):
    """An exercise may ask for a class (`ShardedOptimizer`): a notebook holding just that class
    is the lab's, not another course's."""
    from grader.load.submission import Submission, unfit_by_notebook
    from grader.manifest import load_manifest

    path = write_notebook(tmp_path / "sharded.ipynb", "class ShardedOptimizer:\n    pass")
    manifest = load_manifest()
    exercises = manifest.in_notebook("sharded.ipynb")
    sub = Submission("ann", tmp_path, {"sharded.ipynb": path}, exercises)
    assert unfit_by_notebook(sub, manifest) == {}
