"""Shared pytest set-up: every exercise id is a marker, and `--submission` picks the work to check.

pytest tests                                   the lab's own test suite
pytest grader --submission PATH -m allreduce   one exercise's checks on a submission
"""

from grader.manifest import load_manifest


def pytest_addoption(parser):
    group = parser.getgroup("grader")
    group.addoption(
        "--submission",
        metavar="PATH",
        help="notebook or folder whose checks `pytest grader` runs "
        "(default: work/multigpu if it exists, else exercises/multigpu)",
    )
    group.addoption(
        "--public-only",
        action="store_true",
        help="run only the public checks, even where the hidden ones are installed",
    )


def pytest_configure(config):
    for ex in load_manifest().exercises:
        config.addinivalue_line("markers", f"{ex.id}: the checks of the {ex.id} exercise")
