"""`pytest grader -m EXERCISE --submission PATH`: one exercise's checks as pytest tests."""

import shutil
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


@pytest.mark.slow
def test_a_conftest_in_the_submissions_folder_never_runs(tmp_path):
    """The folder given to --submission is the student's: a conftest.py there is their code,
    and pytest must not run it in the instructor's process (it did, when the option was added
    by the lab's conftest.py: pytest's first reading of the command line took its value for a
    path to test and loaded the conftest.py it found there)."""
    folder = tmp_path / "mallory" / "multigpu"
    shutil.copytree(SOLUTIONS, folder)
    ran = tmp_path / "conftest-ran"
    (folder / "conftest.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    proc = run_pytest("--submission", str(folder), "-m", "try_gpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not ran.exists(), "the submission's conftest.py ran"
