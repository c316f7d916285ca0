"""Grading whole submissions through the command line, as an instructor does."""

import json
import subprocess

import pytest

from grader.manifest import load_manifest
from tests.conftest import EXERCISES, SOLUTIONS, python

MANIFEST = load_manifest()


def grade(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python(), "-m", "grader", *args], capture_output=True, text=True, cwd=cwd, timeout=900
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Grade the reference solutions and the released stubs in one run."""
    out = tmp_path_factory.mktemp("grading") / "r.json"
    proc = grade("grade", str(SOLUTIONS), str(EXERCISES), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())["submissions"]


def test_reference_solutions_get_full_marks(report):
    solutions = report[0]
    assert solutions["max_score"] == MANIFEST.max_score
    assert solutions["score"] == solutions["max_score"], [
        (e["name"], c["name"], c["message"])
        for e in solutions["exercises"]
        for c in e["checks"]
        if not c["passed"]
    ]


def test_stubs_score_zero_on_every_check(report):
    stubs = report[1]
    assert stubs["score"] == 0
    assert stubs["max_score"] == MANIFEST.max_score
    for exercise in stubs["exercises"]:
        for check in exercise["checks"]:
            assert not check["passed"]
            assert "not written yet" in check["message"] or "not judged until" in check["message"]


def test_report_has_the_documented_fields(report):
    for submission in report:
        assert {"id", "score", "max_score", "exercises"} <= submission.keys()
        assert [e["name"] for e in submission["exercises"]] == [ex.id for ex in MANIFEST.exercises]
        for exercise in submission["exercises"]:
            assert {"name", "score", "max_score", "checks"} <= exercise.keys()
            assert exercise["max_score"] == MANIFEST.exercise(exercise["name"]).points
            for check in exercise["checks"]:
                assert {"name", "passed", "points", "message", "hint"} <= check.keys()


def test_submission_ids_come_from_folder_names(report):
    assert [s["id"] for s in report] == ["solutions", "exercises"]


@pytest.mark.slow
def test_a_single_notebook_is_graded_on_its_own_exercises(tmp_path):
    out = tmp_path / "r.json"
    proc = grade("grade", str(SOLUTIONS / "concise.ipynb"), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (sub,) = json.loads(out.read_text())["submissions"]
    assert [e["name"] for e in sub["exercises"]] == ["resnet18", "train_dataparallel"]
    assert sub["score"] == sub["max_score"]


@pytest.mark.slow
def test_check_shows_each_check_and_its_hint(tmp_path):
    proc = grade("check", str(EXERCISES / "from_scratch.ipynb"), "--exercise", "allreduce")
    assert proc.returncode == 1
    assert "allreduce (Sum across devices, in place): 0 of" in proc.stdout
    assert "✗ book_demo_gives_threes_on_both_devices" in proc.stdout
    assert "hint: Replace `raise NotImplementedError` in `allreduce`" in proc.stdout
    assert "(hidden)" not in proc.stdout  # students run public checks only


@pytest.mark.slow
def test_check_passes_on_the_reference(tmp_path):
    proc = grade("check", str(SOLUTIONS), "-e", "split_batch", "-e", "get_params")
    assert proc.returncode == 0, proc.stdout
    assert "split_batch (Split a minibatch across devices): 6 of 6 checks passed" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["grade", "no/such/folder"], "no/such/folder does not exist"),
        (["check", str(SOLUTIONS), "-e", "allreduse"], "no exercise called 'allreduse'"),
    ],
)
def test_bad_input_gets_a_clear_message(args, says):
    proc = grade(*args)
    assert proc.returncode == 2
    assert says in proc.stderr


def test_list_prints_the_manifest_table():
    proc = grade("list")
    assert proc.returncode == 0
    for ex in MANIFEST.exercises:
        assert f"| `{ex.id}` | `{ex.notebook}` | `{ex.function}` | {ex.points:g} |" in proc.stdout


def test_mistakes_lists_the_catalogue():
    proc = grade("mistakes", "-e", "allreduce")
    assert proc.returncode == 0
    assert (
        "| `allreduce` | rebinds list entries | `writes_into_the_tensors_it_was_given` |"
        in proc.stdout
    )
