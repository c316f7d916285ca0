"""The command-line options of `pytest grader` (grader/front/pytest_view.py), loaded with `-p`
from pyproject.toml's addopts.

pytest reads the command line once before it loads any conftest.py, to find where to look for
them. An option that only a conftest.py adds is unknown then, so its value, a submission's
folder, was taken for a path to test and a conftest.py planted in the student's folder ran in
the instructor's process. Added here, the option is known before that first reading."""


def pytest_addoption(parser) -> None:
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
