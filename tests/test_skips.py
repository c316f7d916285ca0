"""Skips are counted by reason, and on CI a skip the project can mend is a failure."""

import os
import subprocess

from grader.manifest import REPO
from tests.conftest import python

SOME_SKIPS = """
import pytest

def test_needs_a_font():
    pytest.skip("no font with Chinese glyphs here (Debian: fonts-wqy-microhei)")

@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_needs_a_gpu():
    pass

def test_needs_the_seeds():
    pytest.skip("the seed notes are not here (../shared/seeds)")

def test_runs():
    pass
"""


def run_pytest(tmp_path, ci: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_some.py").write_text(SOME_SKIPS)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [python(), "-m", "pytest", "-p", "tests.skips", "-p", "no:cacheprovider", "-q", "-rfs"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_last_line_counts_the_skips_by_reason(tmp_path):
    proc = run_pytest(tmp_path, ci="")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("skips by reason (3): 1 x ")
    for reason in ("no font with Chinese glyphs", "needs a CUDA GPU", "the seed notes are not"):
        assert reason in last


def test_on_ci_a_skip_the_project_can_mend_fails_saying_what_is_missing(tmp_path):
    proc = run_pytest(tmp_path, ci="true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 1 passed, 2 skipped" in proc.stdout
    assert "FAILED test_some.py::test_needs_a_font" in proc.stdout
    assert "CI=true: this test would have skipped, and CI must install what it needs: " in (
        proc.stdout
    )
    assert "fonts-wqy-microhei" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == (
        "skips by reason (2): 1 x needs a CUDA GPU; 1 x the seed notes are not here "
        "(../shared/seeds)"
    )
