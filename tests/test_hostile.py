"""Broken and hostile submissions: each scores what it deserves, and the run survives them.

One class of students is graded in a single run, two at a time, into a JSON report, a CSV
gradebook and Gradescope files, once for the whole test run (tests/corpora.py, which also
grades it without the fast path for tests/test_fast_path.py); each test then looks at one
student.
"""

import csv
import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from grader.judge.registry import assignment_points, exercise_points
from grader.manifest import load_manifest
from tests import corpora
from tests.conftest import SOLUTIONS, hidden_checks_file, note_texts, python, write_notebook

MANIFEST = load_manifest()
SCRATCH_POINTS = sum(exercise_points(ex) for ex in MANIFEST.in_notebook("from_scratch.ipynb"))
CONCISE_POINTS = sum(exercise_points(ex) for ex in MANIFEST.in_notebook("concise.ipynb"))
# The class hands in the first two notebooks; the distributed one has a class of its own
# (tests/test_distributed_grading.py).
HANDED_IN = SCRATCH_POINTS + CONCISE_POINTS


def sources(notebook: str) -> list[str]:
    """Return the code cells of a reference notebook."""
    nb = json.loads((SOLUTIONS / notebook).read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def replacing(function: str, new: str | None, notebook: str = "from_scratch.ipynb") -> list[str]:
    """Return the reference cells with the cell defining `function` replaced (None: deleted)."""
    cells = []
    for source in sources(notebook):
        if f"def {function}(" in source:
            if new is not None:
                cells.append(new)
        else:
            cells.append(source)
    return cells


class Server:
    """A TCP server on 127.0.0.1 that counts the connections it gets."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections, self.running = 0, True
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while self.running:
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass

    def close(self):
        self.running = False
        self.thread.join(5)
        self.sock.close()


def build_class(root, server_port, reports):
    """Write every student's folder under root; return {student: notebooks written}."""
    students = {}

    def student(name, scratch=None, concise=None, files=None):
        folder = root / name / MANIFEST.assignment
        folder.mkdir(parents=True)
        for notebook, cells in (("from_scratch.ipynb", scratch), ("concise.ipynb", concise)):
            if isinstance(cells, str):
                (folder / notebook).write_text(cells)
            elif cells is not None:
                write_notebook(folder / notebook, *cells)
        for filename, text in (files or {}).items():
            (folder / filename).write_text(text)
        students[name] = folder

    ref_scratch, ref_concise = sources("from_scratch.ipynb"), sources("concise.ipynb")
    student("good", ref_scratch, ref_concise)
    student("invalid_json", "{this is not json", ref_concise)
    student("empty_notebook", [], ref_concise)
    student("missing_notebook", None, ref_concise)
    student(
        "renamed_function", [s.replace("def allreduce(", "def all_reduce(") for s in ref_scratch]
    )
    student(
        "syntax_error", replacing("split_batch", "def split_batch(X, y, devices)\n    return X, y")
    )
    student("exception_at_import", ["raise RuntimeError('setting up failed')", *ref_scratch])
    student(
        "wrong_signature", replacing("get_params", "def get_params(params):\n    return params")
    )
    student(
        "wrong_return_type",
        replacing("split_batch", "def split_batch(X, y, devices):\n    return 'shards'"),
    )
    student(
        "nan_outputs",
        replacing(
            "allreduce", "def allreduce(data):\n    for t in data:\n        t[:] = float('nan')"
        ),
    )
    student(
        "sys_exit",
        replacing("get_params", "def get_params(params, device):\n    import sys\n    sys.exit(0)"),
    )
    student(
        "os_exit",
        replacing("split_batch", "def split_batch(X, y, devices):\n    import os\n    os._exit(0)"),
    )
    student(
        "segfault",
        replacing(
            "split_batch",
            "def split_batch(X, y, devices):\n    import ctypes\n    ctypes.string_at(0)",
        ),
    )
    student(
        "memory",
        replacing(
            "get_params",
            "def get_params(params, device):\n    big = torch.ones(10**11, dtype=torch.uint8)\n    return [big]",
        ),
    )
    student(
        "network",
        replacing(
            "get_params",
            "def get_params(params, device):\n"
            f"    import socket\n    socket.create_connection(('127.0.0.1', {server_port}), timeout=2)\n"
            "    return [p.detach().to(device, copy=True).requires_grad_() for p in params]",
        ),
    )
    private = [
        str(hidden_checks_file()),
        str(SOLUTIONS / "from_scratch.ipynb"),
    ]
    student(
        "reads_private",
        replacing(
            "get_params",
            "def get_params(params, device):\n"
            f"    for path in {private!r}:\n"
            "        try:\n            open(path).read()\n        except OSError:\n            continue\n"
            "        raise RuntimeError('read ' + path)\n"
            "    return [p.detach().to(device, copy=True).requires_grad_() for p in params]",
        ),
    )
    student(
        "fake_passed_lines",
        [
            "print('allreduce: 6 of 6 checks passed, 11/11 points')\nprint('PASSED 73/73')",
            *replacing(
                "allreduce", "def allreduce(data):\n    print('✓ every_tensor_holds_the_sum  2/2')"
            ),
        ],
    )
    student(
        "monkeypatched_torch",
        [
            "import torch\nimport pytest\ntorch.allclose = lambda *a, **k: True\n"
            "torch.equal = lambda *a, **k: True\npytest.approx = lambda *a, **k: True",
            *replacing("allreduce", "def allreduce(data):\n    pass"),
        ],
    )
    student(
        "conftest_planted",
        ref_scratch,
        None,
        files={
            "conftest.py": (
                f"open({str(root / 'conftest-ran')!r}, 'w').write('ran')\n"
                "import pytest\n@pytest.hookimpl\ndef pytest_runtest_makereport(item, call):\n    pass\n"
            )
        },
    )
    student(
        "writes_results",
        [
            *ref_scratch,
            "for target in " + repr([str(p) for p in reports]) + ":\n"
            "    try:\n        open(target, 'w').write('{\"submissions\": []}')\n"
            "    except OSError as e:\n        print(e)",
        ],
    )
    student(
        "eq_always_true",
        replacing(
            "split_batch",
            (
                "class Anything:\n    def __eq__(self, other):\n        return True\n"
                "    def __len__(self):\n        return 2\n    def __getitem__(self, i):\n        return self\n"
                "def split_batch(X, y, devices):\n    return Anything()"
            ),
        ),
    )
    student(
        "hard_coded_demo",
        replacing(
            "allreduce",
            ("def allreduce(data):\n    for t in data:\n        t[:] = torch.tensor([[3., 3.]])"),
        ),
    )
    student(
        "duplicated_and_deleted_cells",
        [
            *replacing("split_batch", None),
            "def train_batch(X, y, device_params, devices, lr):\n    pass",
        ],
    )
    return students


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once in the run (tests/corpora.py), with the fast path."""
    done = corpora.graded(tmp_path_factory, "hostile")
    return {
        "report": done.report,
        "students": {name: Path(folder) for name, folder in done.extra["students"].items()},
        "out": done.out,
        "classroom": done.classroom,
        "stdout": done.stdout,
        "connections": done.extra["connections"],
    }


def score(sub, exercise):
    return next(e["score"] for e in sub["exercises"] if e["name"] == exercise)


def messages(sub, exercise):
    """Return the exercise's notes and its checks' messages and hints, as one text."""
    (found,) = [e for e in sub["exercises"] if e["name"] == exercise]
    return " ".join(found["notes"] + [c["message"] + " " + c["hint"] for c in found["checks"]])


def scratch_score(sub):
    return sum(
        e["score"]
        for e in sub["exercises"]
        if MANIFEST.exercise(e["name"]).notebook == "from_scratch.ipynb"
    )


def test_every_student_is_graded(graded):
    assert set(graded["report"]) == set(graded["students"])


def test_the_good_student_gets_full_marks(graded):
    good = graded["report"]["good"]
    assert good["score"] == HANDED_IN and good["max_score"] == assignment_points()


def test_invalid_json_scores_zero_on_that_notebook_only(graded):
    sub = graded["report"]["invalid_json"]
    assert scratch_score(sub) == 0 and sub["score"] == CONCISE_POINTS
    assert "is not valid JSON" in messages(sub, "allreduce")


def test_an_empty_notebook_scores_zero(graded):
    sub = graded["report"]["empty_notebook"]
    assert scratch_score(sub) == 0 and sub["score"] == CONCISE_POINTS
    # (a notebook with no cells has none of the lab's: it is named as the wrong notebook)
    assert "from_scratch.ipynb is not the lab's notebook" in messages(sub, "allreduce")


def test_a_missing_notebook_costs_its_exercises_only(graded):
    sub = graded["report"]["missing_notebook"]
    assert sub["score"] == CONCISE_POINTS
    assert "from_scratch.ipynb is missing" in messages(sub, "get_params")


def test_a_renamed_function_costs_its_exercise_only(graded):
    sub = graded["report"]["renamed_function"]
    assert score(sub, "allreduce") == 0
    assert "`allreduce` is not defined" in messages(sub, "allreduce")
    assert score(sub, "get_params") == 11 and score(sub, "split_batch") == 8


def test_a_syntax_error_costs_its_cell_only(graded):
    sub = graded["report"]["syntax_error"]
    assert score(sub, "split_batch") == 0
    assert score(sub, "allreduce") == 11 and score(sub, "get_params") == 11
    assert any("syntax error" in n for n in note_texts(sub))


def test_an_exception_at_import_is_noted_and_costs_nothing(graded):
    sub = graded["report"]["exception_at_import"]
    assert scratch_score(sub) == SCRATCH_POINTS
    assert any("RuntimeError: setting up failed" in n for n in note_texts(sub))


def test_a_wrong_signature_gets_the_signature_hint(graded):
    sub = graded["report"]["wrong_signature"]
    assert score(sub, "get_params") == 0
    assert "Keep the parameters of `get_params`" in messages(sub, "get_params")


def test_a_wrong_return_type_scores_zero_with_what_came_back(graded):
    sub = graded["report"]["wrong_return_type"]
    assert score(sub, "split_batch") == 0
    assert "split_batch returned 'shards'" in messages(sub, "split_batch")


def test_nan_outputs_score_zero(graded):
    sub = graded["report"]["nan_outputs"]
    assert score(sub, "allreduce") == 0
    assert "NaN" in messages(sub, "allreduce")


def test_sys_exit_is_a_failed_call(graded):
    sub = graded["report"]["sys_exit"]
    assert score(sub, "get_params") == 0
    assert "raised SystemExit" in messages(sub, "get_params")
    assert score(sub, "allreduce") == 11


def test_os_exit_costs_the_exercise_it_ended(graded):
    sub = graded["report"]["os_exit"]
    assert score(sub, "split_batch") == 0
    assert "exited with code 0" in messages(sub, "split_batch")
    assert score(sub, "allreduce") == 11
    assert score(sub, "train_loop") == 9  # graded after the crash, with split_batch held right


def test_a_segfault_costs_the_exercise_it_crashed(graded):
    sub = graded["report"]["segfault"]
    assert score(sub, "split_batch") == 0
    assert "segmentation fault" in messages(sub, "split_batch")
    assert score(sub, "allreduce") == 11
    assert score(sub, "train_loop") == 9


def test_memory_exhaustion_hits_the_memory_limit(graded):
    sub = graded["report"]["memory"]
    assert score(sub, "get_params") == 0
    assert "memory limit" in messages(sub, "get_params")
    assert score(sub, "allreduce") == 11


def test_the_network_is_out_of_reach(graded):
    sub = graded["report"]["network"]
    assert graded["connections"] == 0
    assert score(sub, "get_params") == 0
    assert score(sub, "allreduce") == 11


def test_hidden_checks_and_solutions_are_out_of_reach(graded):
    sub = graded["report"]["reads_private"]
    assert score(sub, "get_params") == 11, messages(sub, "get_params")


def test_printing_fake_passes_changes_nothing(graded):
    sub = graded["report"]["fake_passed_lines"]
    assert score(sub, "allreduce") == 0
    assert score(sub, "get_params") == 11


def test_monkeypatching_torch_and_pytest_changes_nothing(graded):
    sub = graded["report"]["monkeypatched_torch"]
    assert score(sub, "allreduce") == 0
    assert score(sub, "get_params") == 11  # its honest exercises still count


def test_a_planted_conftest_is_never_run(graded):
    sub = graded["report"]["conftest_planted"]
    assert scratch_score(sub) == SCRATCH_POINTS
    folder = graded["students"]["conftest_planted"]
    proc = subprocess.run(
        [
            python(),
            "-m",
            "pytest",
            "grader",
            "-q",
            "-p",
            "no:cacheprovider",
            "--submission",
            str(folder),
            "-m",
            "try_gpu",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SOLUTIONS.parent.parent,
    )
    assert proc.returncode == 0, proc.stdout
    assert not (graded["classroom"] / "conftest-ran").exists()


def test_writing_into_the_reports_changes_nothing(graded):
    sub = graded["report"]["writes_results"]
    assert scratch_score(sub) == SCRATCH_POINTS
    rows = {row["student"]: row for row in csv.DictReader((graded["out"] / "grades.csv").open())}
    assert set(rows) == set(graded["students"])
    assert rows["good"]["total"] == f"{HANDED_IN:g}"


def test_an_object_equal_to_everything_fails(graded):
    assert score(graded["report"]["eq_always_true"], "split_batch") == 0


def test_hard_coded_demo_outputs_pass_only_the_demo(graded):
    sub = graded["report"]["hard_coded_demo"]
    passed = [
        c["name"]
        for e in sub["exercises"]
        if e["name"] == "allreduce"
        for c in e["checks"]
        if c["passed"]
    ]
    assert passed == ["book_demo_gives_threes_on_both_devices"]


def test_deleted_and_duplicated_cells_count_as_the_notebook_reads(graded):
    sub = graded["report"]["duplicated_and_deleted_cells"]
    assert score(sub, "split_batch") == 0  # its cell was deleted
    assert score(sub, "train_batch") == 0  # the later definition wins, as in Jupyter
    assert score(sub, "allreduce") == 11


def test_every_student_has_a_gradescope_file(graded):
    for name in graded["students"]:
        data = json.loads((graded["out"] / "gradescope" / name / "results.json").read_text())
        assert data["score"] == graded["report"][name]["score"]


def test_the_run_prints_a_summary_table(graded):
    out = graded["stdout"]
    assert "exercise" in out and "full marks" in out
    assert "total" in out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("loop", "option", "says"),
    [
        (
            "    while True:\n        pass",
            ["--check-timeout", "1"],
            "time limit of 1 s of processor time per check",
        ),
        (
            "    import time\n    while True:\n        try:\n            time.sleep(1)\n"
            "        except BaseException:\n            pass",
            ["--timeout", "5"],
            "ran past the time limit of 5 s of wall time",
        ),
    ],
    ids=["infinite_loop", "loop_that_swallows_the_alarm"],
)
def test_an_endless_loop_hits_a_time_limit_and_grading_goes_on(tmp_path, loop, option, says):
    folder = tmp_path / "loopy" / MANIFEST.assignment
    cells = replacing("try_all_gpus", "def try_all_gpus():\n" + loop)
    write_notebook(folder / "from_scratch.ipynb", *cells)
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            python(),
            "-m",
            "grader",
            "grade",
            str(folder),
            "--json",
            str(out),
            "-e",
            "try_all_gpus",
            "-e",
            "try_gpu",
            *option,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    (sub,) = json.loads(out.read_text())["submissions"]
    assert score(sub, "try_all_gpus") == 0
    assert says in messages(sub, "try_all_gpus")
    assert score(sub, "try_gpu") == 3
