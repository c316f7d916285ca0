"""Shared pytest set-up: every exercise id is a marker, and `--submission` picks the work to check.

pytest tests                                   the lab's own test suite
pytest grader --submission PATH -m allreduce   one exercise's checks on a submission
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from grader.manifest import REPO, load_manifest

# The checks of a submission as pytest tests: the product's, not a test of the lab's, so its
# name does not start with test_, and `pytest grader` collects it by name alone.
PYTEST_VIEW = REPO / "grader" / "front" / "pytest_view.py"


def pytest_addoption(parser):
    # (`--submission` and `--public-only` are added by grader/front/pytest_options.py, which
    # pyproject.toml's addopts loads before the command line is first read.)
    parser.getgroup("grader").addoption(
        "--record-durations",
        metavar="PATH",
        help="write each test module's seconds to PATH, which orders the next runs "
        "(tests/durations.py)",
    )


def pytest_collect_file(file_path, parent):
    if file_path == PYTEST_VIEW:
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_configure(config):
    # The warm fork servers the tests start are theirs alone, and stop when the tests end.
    if "GRADER_WARM_DIR" not in os.environ:
        os.environ["GRADER_WARM_DIR"] = tempfile.mkdtemp(prefix="grader-warm-tests-")
        config._warm_folder = Path(os.environ["GRADER_WARM_DIR"])
    for ex in load_manifest().exercises:
        config.addinivalue_line("markers", f"{ex.id}: the checks of the {ex.id} exercise")


def pytest_unconfigure(config):
    folder = getattr(config, "_warm_folder", None)
    if folder is not None:
        from grader.sandbox.fast.warm_client import stop_warm

        stop_warm(folder)
        for made in (folder, folder.with_name(f"{folder.name}-cache")):
            shutil.rmtree(made, ignore_errors=True)
