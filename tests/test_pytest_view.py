"""`pytest grader -m EXERCISE --submission PATH`: one exercise's checks as pytest tests."""

import subprocess

import pytest

from grader.manifest import REPO
from tests.conftest import EXERCISES, SOLUTIONS, python


def run_pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python(), "-m", "pytest", "grader", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_one_exercise_passes_on_the_reference():
    proc = run_pytest("--submission", str(SOLUTIONS), "-m", "split_batch")
    assert proc.returncode == 0, proc.stdout
    assert "7 passed" in proc.stdout


@pytest.mark.slow
def test_a_student_sees_each_failing_check_with_its_hint():
    proc = run_pytest(
        "--submission", str(EXERCISES / "from_scratch.ipynb"), "-m", "allreduce", "--public-only"
    )
    assert proc.returncode == 1
    assert (
        "FAILED grader/front/pytest_view.py::test_check[allreduce::book_demo_gives_threes"
        in proc.stdout
    )
    assert "hint: Replace `raise NotImplementedError` in `allreduce`" in proc.stdout
    assert "6 failed" in proc.stdout  # the public checks only
