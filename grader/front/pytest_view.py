"""The checks of one submission as pytest tests, one test per check, marked by exercise.

    pytest grader --submission work/multigpu -m allreduce

The submission is graded once, in a child process as by `python -m grader check`; each
test then reports one check's verdict, with its hint when it fails.
"""

from pathlib import Path

import pytest

import labtext
from grader.grading import grade_path
from grader.judge.registry import hidden_available, hidden_checks, public_checks
from grader.manifest import REPO, load_manifest
from grader.report.text import check_said
from labtext import _


def _use_hidden(config) -> bool:
    return not config.getoption("--public-only")


def _all_checks(config) -> list:
    params = []
    for ex in load_manifest().exercises:
        checks = public_checks(ex)
        if _use_hidden(config) and hidden_available(ex):
            checks += hidden_checks(ex)
        for c in checks:
            params.append(
                pytest.param(
                    ex.id, c.name, marks=getattr(pytest.mark, ex.id), id=f"{ex.id}::{c.name}"
                )
            )
    return params


def pytest_generate_tests(metafunc):
    if {"exercise_id", "check_name"} <= set(metafunc.fixturenames):
        metafunc.parametrize(("exercise_id", "check_name"), _all_checks(metafunc.config))


def _submission(config) -> Path:
    given = config.getoption("--submission")
    if given:
        return Path(given)
    assignment = load_manifest().assignment
    work = REPO / "work" / assignment
    return work if work.is_dir() else REPO / "exercises" / assignment


@pytest.fixture(scope="session")
def verdicts(request) -> dict:
    """Grade the submission once, for the exercises of the selected tests only."""
    selected = sorted(
        {
            item.callspec.params["exercise_id"]
            for item in request.session.items
            if hasattr(item, "callspec") and "exercise_id" in item.callspec.params
        }
    )
    hidden = _use_hidden(request.config) and all(
        hidden_available(load_manifest().exercise(e)) for e in selected
    )
    result = grade_path(_submission(request.config), selected, hidden=hidden)
    with labtext.speaking(result.language):
        return {(e.name, c.name): (c, check_said(c)) for e in result.exercises for c in e.checks}


def test_check(verdicts, exercise_id, check_name):
    found = verdicts.get((exercise_id, check_name))
    if found is None:
        pytest.fail(_("{check} was not graded").format(check=check_name), pytrace=False)
    verdict, said = found
    if not verdict.passed:
        hint = _("hint: {hint}").format(hint=verdict.hint)
        pytest.fail(f"{said}\n{hint}", pytrace=False)
