"""Grading whole submissions through the command line, as an instructor does."""

import json
import subprocess

import pytest

from grader.base.protocol import CaseOutcome
from grader.judge.registry import exercise_checks, exercise_points, narrowed
from grader.manifest import REPO, load_manifest
from grader.report.json_report import read_json
from grader.report.text import render_exercise
from tests.conftest import EXERCISES, SOLUTIONS, python

MANIFEST = load_manifest()


def grade(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python(), "-m", "grader", *args], capture_output=True, text=True, cwd=cwd, timeout=900
    )


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
    """A student's check starts its child before the fork server has imported torch._dynamo:
    the distributed exercise's first launch imports it there, which must not look like a change
    to torch (it sets a flag in torch.distributed)."""
    exercises = ["split_batch", "get_params", "evaluate_accuracy_distributed"]
    proc = grade("check", str(SOLUTIONS), *[arg for ex in exercises for arg in ("-e", ex)])
    assert proc.returncode == 0, proc.stdout
    assert (
        "split_batch (Split a minibatch across devices): 6 of 6 public checks passed, 6/8"
        in proc.stdout
    )
    assert "(Accuracy over every rank's shard): 5 of 5 public checks passed" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["grade", "no/such/folder"], "no/such/folder does not exist"),
        (["check", str(SOLUTIONS), "-e", "allreduse"], "did you mean 'allreduce'?"),
        (["check", str(SOLUTIONS), "-e", "sgd"], "the exercises are: try_gpu, try_all_gpus,"),
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
        assert (
            f"| `{ex.id}` | `{ex.notebook}` | `{ex.function}` | {exercise_points(ex):g} |"
            in proc.stdout
        )


def test_mistakes_lists_the_catalogue():
    proc = grade("mistakes", "-e", "allreduce")
    assert proc.returncode == 0
    assert (
        "| `allreduce` | rebinds list entries | `writes_into_the_tensors_it_was_given` |"
        in proc.stdout
    )


def test_narrowing_to_one_check_keeps_the_checks_it_comes_after():
    checks = exercise_checks(MANIFEST.exercise("get_params"), include_hidden=True)
    after = next(c for c in checks if c.after)
    kept = narrowed(checks, {after.name})
    assert {c.name for c in kept} == {after.name, *after.after}
    assert narrowed(checks, None) == checks
    with pytest.raises(ValueError, match="no check called nope"):
        narrowed(checks, {"nope"})


def judged_with(owner_fails: bool, owner_after: tuple[str, ...] = ()) -> dict:
    """Judge three checks of one case: `first` fails; `owner` fails when asked (and waits on
    `owner_after`); `second` fails naming `owner` as the check that charges its cause."""
    from grader.api import Context, case, check_on, expect
    from grader.judge.verdicts import judge_exercise

    @case
    def nothing(student, ctx):
        return None

    def judge(fails: bool, see: str | None = None):
        return lambda seen, ctx: expect(not fails, "it failed", "a hint", see=see)

    checks = [
        check_on(nothing, points=1, hint="a hint")(judge(True)),
        check_on(nothing, points=2, hint="a hint", after=owner_after)(judge(owner_fails)),
        check_on(nothing, points=3, hint="a hint")(judge(True, see="owner")),
    ]
    for c, name in zip(checks, ("first", "owner", "second"), strict=True):
        object.__setattr__(c, "name", name)
    result = judge_exercise(
        "ex", "fn", checks, {"nothing": CaseOutcome("nothing")}, Context(0), str
    )
    return {c.name: c for c in result.checks}


def test_a_failure_whose_cause_another_check_charges_keeps_its_points():
    verdicts = judged_with(owner_fails=True)
    assert not verdicts["owner"].passed and verdicts["owner"].points == 0
    second = verdicts["second"]
    assert second.passed and second.points == 3
    assert second.kept_for == "owner" and second.message == "it failed"
    from grader.report.text import check_said

    assert "`owner` charges for the same cause (it failed)" in check_said(second)


def test_it_fails_where_the_check_it_names_passed_or_was_not_judged():
    assert not judged_with(owner_fails=False)["second"].passed
    verdicts = judged_with(owner_fails=True, owner_after=("first",))
    assert "not judged until" in verdicts["owner"].message
    assert not verdicts["second"].passed


def test_a_check_that_cannot_see_its_property_is_not_judged_and_charges_nothing():
    from grader.api import Context, case, check_on, observe
    from grader.judge.verdicts import judge_verdicts

    @case
    def nothing(student, ctx):
        return None

    def blind(seen, ctx):
        observe(seen is not None, "owner", "there is nothing to look at")

    (verdict,) = judge_verdicts(
        "fn",
        [check_on(nothing, points=2, hint="a hint")(blind)],
        {"nothing": CaseOutcome("nothing")},
        Context(0),
        str,
    )
    assert not verdict.result.passed and verdict.result.points == 0
    assert not verdict.charged
    assert verdict.result.message == "not judged: there is nothing to look at (`owner` judges that)"


def test_a_failure_whose_owner_in_turn_names_another_keeps_its_points():
    """`second` names `owner`, which names `first`, which charges: both keep their points,
    and say that `first` charges."""
    from grader.api import Context, case, check_on, expect
    from grader.judge.verdicts import judge_exercise

    @case
    def nothing(student, ctx):
        return None

    def judge(see: str | None = None):
        return lambda seen, ctx: expect(False, "it failed", "a hint", see=see)

    checks = [
        check_on(nothing, points=1, hint="a hint")(judge()),
        check_on(nothing, points=2, hint="a hint")(judge(see="first")),
        check_on(nothing, points=3, hint="a hint")(judge(see="owner")),
    ]
    for c, name in zip(checks, ("first", "owner", "second"), strict=True):
        object.__setattr__(c, "name", name)
    result = judge_exercise(
        "ex", "fn", checks, {"nothing": CaseOutcome("nothing")}, Context(0), str
    )
    got = {c.name: c for c in result.checks}
    assert result.score == 5 and not got["first"].passed
    for name in ("owner", "second"):
        assert got[name].kept_for == "first", got[name]


def test_a_failure_shows_tensors_briefly():
    """A failure names what came back in a line a student can read: a few numbers to four
    significant digits, a longer tensor by its shape and first values (issue 31)."""
    import re

    import torch

    from grader.api import Fail, expect_close, expect_equal

    with pytest.raises(Fail) as small:
        expect_equal(torch.tensor([0.1 + 0.2, 1 / 3]), torch.tensor([0.3, 0.5]), "the sum")
    assert "came back [0.3, 0.3333] (float32), expected [0.3, 0.5] (float32)" in small.value.message
    with pytest.raises(Fail) as long:
        expect_close(torch.arange(12.0) / 7, torch.zeros(12), "the mean")
    message = long.value.message
    assert "came back shape (12,) starting [0.0, 0.1429, 0.2857, 0.4286, ...] (float32)" in message
    digits = [len(n.replace(".", "").lstrip("0")) for n in re.findall(r"\d+\.\d+", message)]
    assert digits and max(digits) <= 4, message


@pytest.mark.slow
def test_check_of_one_exercise_shows_no_notes_about_the_others():
    """`check --exercise allreduce` on the released stubs reports allreduce alone; without
    --exercise the notes about the other stubs' cells come too, each cell named as JupyterLab
    shows it, never by a number (issue 31)."""
    notebook = str(EXERCISES / "from_scratch.ipynb")
    one = grade("check", notebook, "-e", "allreduce")
    assert (
        "allreduce (Sum across devices, in place): 0 of 6 public checks passed, 0/11" in one.stdout
    )
    assert "While loading" not in one.stdout, one.stdout
    every = grade("check", notebook)
    notes = every.stdout.split("While loading the notebooks:")[1].splitlines()
    assert any("from_scratch.ipynb: cell `print(try_all_gpus())`, line 1" in n for n in notes)
    assert not any("code cell" in n for n in notes), notes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "from_scratch.ipynb is not valid JSON"),
        (
            '{"cells": [{"cell_type": "code", "metadata": {}, "source": "print(1)"}]}',
            "from_scratch.ipynb is not the lab's notebook: it has none of from_scratch.ipynb's",
        ),
    ],
)
def test_a_notebook_that_cannot_be_checked_gets_one_clear_error(tmp_path, text, says):
    """A file that is no notebook, or another course's notebook under the lab's name: one
    line that names the file, says what is wrong and what to do; no report of checks that
    judged nothing, and no path of the grader's own copy (issue 31)."""
    (tmp_path / "from_scratch.ipynb").write_text(text)
    proc = grade("check", str(tmp_path / "from_scratch.ipynb"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("dplab:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {says}"), proc.stderr
    assert "/tmp" not in proc.stderr and "grade-" not in proc.stderr
    # Grading a class, the student still gets a result: the reason once per exercise, and
    # no line per check.
    report = tmp_path / "r.json"
    proc = grade("grade", str(tmp_path), "-e", "allreduce", "--json", str(report))
    assert proc.returncode == 0, proc.stderr
    (result,) = read_json(report)
    (allreduce,) = result.exercises
    assert allreduce.score == 0 and allreduce.notes[0].startswith(says)
    shown = render_exercise(allreduce)
    assert shown.count(says) == 1 and "✗" not in shown, shown


def test_the_report_reads_facts_from_fields_never_from_a_message():
    """A check's words are shown as they are: what it looks like (a not-run check, another
    check's "also failed", another language's) tells the report nothing; its fields do."""
    import labtext
    from grader.base.results import CheckResult, exercise_result
    from grader.report.text import NOT_RUN, check_said, render_exercise

    for language in labtext.LANGUAGES:
        with labtext.speaking(language):
            looks_not_run = CheckResult("a", False, 0, 1, labtext._(NOT_RUN), "a hint")
            shown = render_exercise(exercise_result("ex", [looks_not_run]))
            assert "✗ a" in shown and "hint: a hint" in shown.replace("提示：", "hint: ")
            wrapped = "boom (the same error also failed: b)"
            looks_wrapped = CheckResult("a", False, 0, 1, wrapped, "")
            assert check_said(looks_wrapped, alone=True) == wrapped
            not_run = CheckResult("a", False, 0, 1, "", "", not_run=True)
            assert check_said(not_run) == labtext._(NOT_RUN)
            also = CheckResult("a", False, 0, 1, "boom", "", also_failed=["b", "c"])
            assert check_said(also, alone=True) == "boom" and "b, c" in check_said(also)
    scanned = [
        path
        for folder in ("judge", "report", "front", "load", "sandbox")
        for path in (REPO / "grader" / folder).rglob("*.py")
    ]
    assert scanned
    # A message matched in every language (a template made a pattern) is a message parsed.
    matching = [p.name for p in scanned if "LANGUAGES" in p.read_text(encoding="utf-8")]
    assert matching == [], matching


def test_an_error_is_shown_once_per_exercise():
    """Checks that one error failed show it once; the others point to it (issue 31). Two
    failures of one deadlock say different seconds: their `cause` tells them one."""
    from grader.base.results import CheckResult, exercise_result
    from grader.report.text import render_exercise

    def failed(name: str, seconds: str) -> CheckResult:
        message = f"the ranks are waiting: rank 0 computed nothing for {seconds} s"
        return CheckResult(name, False, 0, 1, message, "post the send with isend", cause="hung")

    shown = render_exercise(exercise_result("ring", [failed("a", "0.8"), failed("b", "5")]))
    assert shown.count("computed nothing") == 1 and shown.count("hint:") == 1, shown
    assert shown.splitlines()[-1] == "      the same as `a` above"
