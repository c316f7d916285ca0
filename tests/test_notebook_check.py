"""`check(...)` in a notebook cell: verdicts printed, points returned, nothing on stderr."""

import contextlib
import io
import re

import pytest

from grader.exercises.catalogue import mistakes_of
from grader.front.kernel import check_in_kernel as check
from grader.manifest import load_manifest
from tests.conftest import fresh_solution


def run_check(*args, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        points = check(*args, **kwargs)
    return points, out.getvalue(), err.getvalue()


def test_a_wrong_function_earns_partial_points_and_a_hint():
    ns = fresh_solution("from_scratch.ipynb")
    exec(mistakes_of(load_manifest().exercise("allreduce"))["rebinds_list_entries"].source, ns)
    points, out, err = run_check("allreduce", ns["allreduce"])
    assert points == 7.0  # 9 public points, less the 2 of the one check the mistake fails
    assert "✗ writes_into_the_tensors_it_was_given    0/2" in out
    assert "hint: `data[i] = ...` only makes the list point at a new tensor" in out
    assert err == ""  # nbgrader gives no points to a cell that writes to stderr


def test_hidden_checks_add_to_the_public_ones():
    ns = fresh_solution("from_scratch.ipynb")
    public, _, _ = run_check("split_batch", ns["split_batch"])
    total, out, _ = run_check("split_batch", ns["split_batch"], hidden=True)
    assert (public, total) == (6.0, 8.0)
    assert re.search(r"✓ matches_the_reference_on_random_batches +2/2 \(hidden\)", out)


def test_a_check_cell_shows_its_points_in_words_and_nbgrader_reads_the_number():
    """Under the report, JupyterLab shows the points in a sentence that says hidden checks
    exist, not a bare 6.0; nbgrader's partial credit still reads the plain number."""
    ns = fresh_solution("from_scratch.ipynb")
    public, _, _ = run_check("split_batch", ns["split_batch"])
    assert repr(public) == "6.0" and float(public) == 6.0
    shown = public._repr_markdown_()
    assert shown == (
        "**6 of 8 points** so far: the public checks hold 6 of them. Hidden checks, run when "
        "your work is graded, hold the other 2."
    )
    total, _, _ = run_check("split_batch", ns["split_batch"], hidden=True)
    assert total._repr_markdown_() == "**8 of 8 points** (public and hidden checks)"


def test_a_students_copy_shows_the_exercises_whole_total(monkeypatch):
    """Where the hidden checks are not installed (the students' image), the total comes from
    the released notebook's check cell, so the student sees the same 8 as the instructor."""
    import grader.judge.registry as registry

    monkeypatch.setattr(registry, "hidden_available", lambda exercise: False)
    ns = fresh_solution("from_scratch.ipynb")
    public, out, _ = run_check("split_batch", ns["split_batch"])
    assert "6 of 6 public checks passed, 6/8 points (the public checks hold 6; hidden" in out
    assert public._repr_markdown_().startswith("**6 of 8 points** so far")


def test_outside_a_notebook_the_function_must_be_given():
    with pytest.raises(TypeError, match=r"pass the function: check\('allreduce', allreduce\)"):
        check("allreduce")


def test_an_unknown_exercise_is_named():
    with pytest.raises(KeyError, match="no exercise called 'allreduse': did you mean 'allreduce'"):
        check("allreduse", print)
