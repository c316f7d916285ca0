"""Skips, accounted for: `make test` ends with a line that counts them by reason, and on CI
(`CI=true`) a test that would skip for a reason the project can mend fails instead.

Only two kinds of skip are the machine's to decide, and may stay skips on CI: the tests that
need a CUDA GPU (marked gpu or multigpu, or skipping because of what the GPUs are), and those
of the seeds' notes, which live beside a checkout, never in a clone. Everything else a test
skips for (a package of the lock, the hub's proxy, Node, a Python for students, Slurm,
podman, a font, Fashion-MNIST) CI installs, so there a skip would hide a broken set-up.
"""

import os
import re
from collections import Counter

import pytest

GPU_REASON = re.compile(r"\b(GPUs?|CUDA|NCCL)\b")
SEEDS_REASON = re.compile(r"\bseed notes\b")


def on_ci() -> bool:
    """Return True where the environment says this is a CI run (CI=true, as CI services set)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def reason_of(report: pytest.TestReport) -> str:
    """Return the reason a skipped report gives, without pytest's "Skipped: "."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ").strip()


def may_skip_on_ci(item: pytest.Item, reason: str) -> bool:
    """Return True for a skip that is the machine's to decide (see the module's docstring)."""
    if item.get_closest_marker("gpu") or item.get_closest_marker("multigpu"):
        return True
    return bool(GPU_REASON.search(reason) or SEEDS_REASON.search(reason))


def fail_mendable_skip(item: pytest.Item, report: pytest.TestReport) -> None:
    """On CI, turn a skip the project can mend into a failure that says what is missing."""
    if not (report.skipped and on_ci()) or hasattr(report, "wasxfail"):
        return
    reason = reason_of(report)
    if may_skip_on_ci(item, reason):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"CI=true: this test would have skipped, and CI must install what it needs: {reason}"
    )


def summary_line(counts: Counter) -> str:
    """Return the skips counted by reason, most first, on one line."""
    if not counts:
        return "skips by reason: none"
    parts = [f"{n} x {reason}" for reason, n in counts.most_common()]
    return f"skips by reason ({sum(counts.values())}): " + "; ".join(parts)


# ---- the hooks (tests/conftest.py imports them; `pytest -p tests.skips` loads them alone) -----

_skipped: Counter = Counter()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_mendable_skip(item, outcome.get_result())


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped[reason_of(report)] += 1


def pytest_unconfigure(config):
    # After pytest's own last line, in the process that reports (not in xdist's workers).
    if not hasattr(config, "workerinput") and not config.option.collectonly:
        print(summary_line(_skipped))
