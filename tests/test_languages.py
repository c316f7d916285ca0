"""The grader speaks the submission's language: a Chinese notebook's report is in Chinese, an
English notebook's in the run's language (`--lang`, `LAB_LANG`, the locale), and `grade`
writes each student's feedback file in that student's language while its own lines stay in
the run's."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import labtext
from grader.manifest import REPO, load_manifest
from grader.report.feedback import item

MANIFEST = load_manifest()
NOTEBOOK = "from_scratch.ipynb"
ENGLISH = REPO / "exercises" / MANIFEST.assignment / NOTEBOOK
CHINESE = REPO / "exercises" / "zh_CN" / MANIFEST.assignment / NOTEBOOK
CJK = re.compile(r"[\u4e00-\u9fff]")

ENGLISH_HEADER = "allreduce (Sum across devices, in place): 0 of 6 public checks passed"
CHINESE_HEADER = "：6 项公开检查通过了 0 项，0/11 分（公开检查占 9 分；"  # after the title
CHINESE_HINT = "\n      提示："
ENGLISH_HINT = "\n      hint: "


def chinese(message: str) -> str:
    return labtext.translate("zh_CN", message)


def environment(**extra: str) -> dict[str, str]:
    """The environment of a grader run: no language of the caller's, no warm server."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LAB_LANG", "LC_ALL", "LC_MESSAGES", "LANG")
    }
    return {**env, "GRADER_WARM_SECONDS": "0", **extra}


def grader(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grader", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=environment(**env),
    )


def check(notebook, *options: str, **env: str) -> str:
    proc = grader(*options, "check", str(notebook), "-e", "allreduce", **env)
    assert proc.returncode == 1 and "allreduce" in proc.stdout, proc.stderr  # stubs fail
    return proc.stdout


def test_a_chinese_notebook_is_checked_in_chinese():
    out = check(CHINESE)
    assert CHINESE_HEADER in out
    assert CHINESE_HINT in out
    assert ENGLISH_HEADER not in out and "public checks" not in out
    assert ENGLISH_HINT not in out


@pytest.mark.parametrize("how", ["--lang", "LAB_LANG"])
def test_an_english_notebook_is_checked_in_the_language_asked_for(how):
    out = check(ENGLISH, "--lang", "zh_CN") if how == "--lang" else check(ENGLISH, LAB_LANG="zh_CN")
    assert CHINESE_HEADER in out and CHINESE_HINT in out
    assert ENGLISH_HEADER not in out


def test_an_english_notebook_is_checked_in_english_by_default():
    out = check(ENGLISH)
    assert ENGLISH_HEADER in out and ENGLISH_HINT in out
    assert not CJK.search(out.split("\n", 1)[1])  # (the first line may be dplab's)


def test_checking_one_exercise_keeps_the_notes_about_its_cells_in_either_language(tmp_path):
    """`check -e allreduce` shows what loading noted about allreduce's cells, and not about
    another exercise's: notes carry the cell they are about, whatever language says them."""
    nb = json.loads(CHINESE.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        raising = {"allreduce-solution": "int('allreduce')", "split_batch-solution": "int('split')"}
        if grade_id in raising:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = source + "\n" + raising[grade_id]
    notebook = tmp_path / NOTEBOOK
    notebook.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    for options in ((), ("--lang", "en")):
        out = check(notebook, *options)
        assert "'allreduce'" in out and "'split'" not in out, out
    assert CJK.search(next(line for line in out.splitlines() if "'allreduce'" in line))


@pytest.mark.slow
def test_grade_writes_each_feedback_file_in_its_students_language(tmp_path):
    submitted = tmp_path / "submitted"
    for student, notebook in (("ann", ENGLISH), ("bo", CHINESE)):
        folder = submitted / student / MANIFEST.assignment
        folder.mkdir(parents=True)
        shutil.copy(notebook, folder / NOTEBOOK)
    feedback = tmp_path / "feedback"
    proc = grader("grade", str(submitted), "--feedback", str(feedback), "-e", "allreduce")
    assert proc.returncode == 0, proc.stderr

    ann = (feedback / "ann.md").read_text(encoding="utf-8")
    bo = (feedback / "bo.md").read_text(encoding="utf-8")
    assert ann.startswith("# Feedback for ann\n")
    assert bo.startswith("# " + chinese("Feedback for {id}").format(id="bo") + "\n")
    assert not CJK.search(ann)
    assert chinese("Public checks (the ones your own `check` runs):") in bo
    assert "Public checks" not in bo
    # under each check, what it proves, in the reader's language
    from grader.judge.registry import public_checks

    (doc,) = [
        c.doc
        for c in public_checks(MANIFEST.exercise("allreduce"))
        if c.name == "every_tensor_holds_the_sum"
    ]
    assert "\n".join(item(" ".join(doc.split()), "  ")) + "\n" in ann
    assert "\n".join(item(" ".join(chinese(doc).split()), "  ")) + "\n" in bo

    # the instructor's lines stay in the run's language (English here)
    assert f"feedback written to {feedback}" in proc.stdout
    assert re.search(r"^exercise +mean +max +full marks$", proc.stdout, re.M)
    assert not CJK.search(proc.stdout)


def test_a_check_cell_speaks_its_notebooks_language(monkeypatch, capsys):
    """In a kernel, Jupyter names the notebook (JPY_SESSION_NAME); a Chinese one's check cell
    reports in Chinese, and says its points in Chinese under the report."""
    from grader.front.kernel import check_in_kernel as check_cell
    from tests.conftest import fresh_solution

    for name in ("LAB_LANG", "LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    split_batch = fresh_solution(NOTEBOOK)["split_batch"]
    monkeypatch.setenv("JPY_SESSION_NAME", str(CHINESE))
    points = check_cell("split_batch", split_batch)
    out = capsys.readouterr().out
    assert "项公开检查通过了" in out and "public checks" not in out
    assert points._repr_markdown_().startswith("**6 分（共 8 分）**")
    monkeypatch.setenv("JPY_SESSION_NAME", str(ENGLISH))
    points = check_cell("split_batch", split_batch)
    assert "public checks passed" in capsys.readouterr().out
    assert points._repr_markdown_().startswith("**6 of 8 points**")


def test_a_group_that_never_formed_is_known_in_either_language():
    """The grader runs again a group whose ranks could not connect (not the student's fault),
    whatever language the launch's message is in: it reads the exception's name, not the text."""
    from dplab.launched import GroupNotFormed, RankFailed
    from grader.ranks.launching import not_formed

    for language in ("en", "zh_CN"):
        with labtext.speaking(language):
            text = labtext._("rank {rank} raised {kind}: {message}")
            failed = RankFailed(text, 0, ["", ""], raised=GroupNotFormed.__name__)
            assert not_formed(failed)
            assert not not_formed(RankFailed(text, 0, ["", ""], raised="ValueError"))


def test_one_deadlock_is_shown_once_in_either_language():
    """Two checks stopped by the same deadlock differ only in how long the ranks idled, and
    have one cause: the report shows the block once and points to it, in Chinese as in
    English."""
    from grader.base.results import CheckResult, exercise_result
    from grader.report.text import render_exercise

    for language, seconds in (("en", ("0.8 s", "0.9 s")), ("zh_CN", ("0.8秒", "0.9秒"))):
        with labtext.speaking(language):
            checks = [
                CheckResult(
                    name, False, 0.0, 1.0, f"rank 0 idle {s}: waiting in send", "hint", cause="x"
                )
                for name, s in zip(("first", "second"), seconds, strict=True)
            ]
            text = render_exercise(exercise_result("ring_allreduce", checks))
            assert text.count("waiting in send") == 1, text
            assert labtext._("the same as {check} above").format(check="`first`") in text


def test_a_check_cell_run_by_nbgrader_speaks_its_notebooks_language(tmp_path, monkeypatch, capsys):
    """nbgrader's autograding runs a notebook in its own folder and names it nowhere: the
    check cell finds the exercise's notebook there, and speaks its language."""
    from grader.front.kernel import check_in_kernel as check_cell
    from tests.conftest import fresh_solution

    for name in ("LAB_LANG", "LC_ALL", "LC_MESSAGES", "LANG", "JPY_SESSION_NAME"):
        monkeypatch.delenv(name, raising=False)
    split_batch = fresh_solution(NOTEBOOK)["split_batch"]
    for notebook, said in ((CHINESE, "项公开检查通过了"), (ENGLISH, "public checks passed")):
        folder = tmp_path / notebook.parent.parent.name
        folder.mkdir()
        shutil.copy(notebook, folder / NOTEBOOK)
        monkeypatch.chdir(folder)
        check_cell("split_batch", split_batch)
        assert said in capsys.readouterr().out


def test_the_stand_in_note_is_said_once_in_the_language_of_whoever_runs_it(capsys, monkeypatch):
    """The note is for the person at the terminal: an instructor grading in English hears it
    in English while a Chinese submission is judged, and once however many languages the
    class speaks."""
    import dplab.devices
    from dplab.devices import try_gpu

    for name in ("LAB_LANG", "LC_ALL", "LC_MESSAGES", "LANG", "JPY_SESSION_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(dplab.devices, "_told", set())
    monkeypatch.setattr(dplab.devices, "num_gpus", lambda: 0)
    with labtext.speaking("zh_CN"):
        try_gpu(1)
    with labtext.speaking("en"):
        try_gpu(1)
    printed = capsys.readouterr().out
    assert printed.count("dplab") == 1 and "this machine has no GPU" in printed
    monkeypatch.setattr(dplab.devices, "_told", set())
    monkeypatch.setenv("LAB_LANG", "zh_CN")  # a Chinese lab's kernel
    try_gpu(1)
    printed = capsys.readouterr().out
    assert printed.startswith("dplab") and CJK.search(printed), printed
