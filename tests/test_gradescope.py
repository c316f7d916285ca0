"""Gradescope's autograder: the zip `gradescope-bundle` writes, unpacked as Gradescope lays it
out (/autograder/source, submission/, results/), and its run_autograder run for a complete, a
broken and a wrong submission, and for a grader that ends without results. The results must
be what `grade` gives the same notebooks, or say why there are none.

(The zip's setup.sh, which installs the lab's lock, runs inside a container under Gradescope's
limits in `make images`; here run_autograder uses this checkout's Python.)"""

import json
import os
import shutil
import subprocess
import zipfile

import nbformat
import pytest

from grader.benchmarks.grade import make_class
from grader.manifest import load_manifest
from tests.cgroups import LimitedGroup
from tests.conftest import EXERCISES, python

pytestmark = pytest.mark.slow
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


def write_bundle(out):
    """`python -m grader gradescope-bundle OUT`: the zip to upload."""
    done = subprocess.run([python(), "-m", "grader", "gradescope-bundle", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def unpacked(bundle, root):
    """Lay `root` out as Gradescope's /autograder/, the zip in source/; return it."""
    for folder in ("source", "submission", "results"):
        (root / folder).mkdir(parents=True)
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / "source")
    for name in ("setup.sh", "run_autograder"):
        (root / "source" / name).chmod(0o755)
    return root


def hand_in(root, files, email) -> None:
    """Put `files` (notebooks or folders) alone in root/submission/, as `email` submitted them."""
    shutil.rmtree(root / "submission")
    (root / "submission").mkdir()
    for f in files:
        if f.is_dir():
            shutil.copytree(f, root / "submission" / f.name)
        else:
            shutil.copy(f, root / "submission" / f.name)
    (root / "submission_metadata.json").write_text(json.dumps({"users": [{"email": email}]}))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("bundle") / "autograder.zip")


def autograde(bundle, tmp_path, files, email="ann@example.org", env=None, prefix=()) -> dict:
    """Unpack the zip as Gradescope does, put `files` in submission/, run run_autograder
    (after the words of `prefix`)."""
    root = unpacked(bundle, tmp_path / "autograder")
    hand_in(root, files, email)
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": python(), **(env or {})}
    done = subprocess.run([*prefix, str(root / "source" / "run_autograder")], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


@pytest.fixture(scope="module")
def graded_student(tmp_path_factory):
    """`grade`'s report of student k of the bench's class (tests that hand in the same
    notebooks another way share it), graded once in the module."""
    done: dict[int, dict] = {}

    def report(k: int) -> dict:
        if k not in done:
            root = tmp_path_factory.mktemp(f"class-{k}")
            make_class(root, k)
            done[k] = graded(root / f"student{k:02d}" / "multigpu")
        return done[k]

    return report


def graded(folder) -> dict:
    """`python -m grader grade` of a folder of notebooks: its one submission's report."""
    out = folder.parent / f"{folder.name}.json"
    done = subprocess.run([python(), "-m", "grader", "grade", str(folder), "--json", str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())["submissions"][0]


def same_as_grade(results: dict, report: dict) -> None:
    """Gradescope's results hold `grade`'s points, check by check (a difference is shown with
    what each check said) and in all."""
    for test in results["tests"]:
        assert set(test) >= {"name", "score", "max_score", "output", "visibility"}
        assert test["visibility"] in VISIBILITY
    by_check = {
        f"{e['name']}: {c['name']}": (c["points"], c["max_points"], c["hidden"])
        for e in report["exercises"]
        for c in e["checks"]
    }
    differ = [
        f"{t['name']}: {t['score']} of {t['max_score']} here, {by_check.get(t['name'])} in grade: "
        f"{t['output']}"
        for t in results["tests"]
        if by_check.get(t["name"], (None,))[0] != t["score"]
    ]
    assert {
        t["name"]: (t["score"], t["max_score"], t["visibility"] == "hidden")
        for t in results["tests"]
    } == by_check, "\n".join(differ)
    assert results["score"] == report["score"]


def test_the_zip_has_gradescopes_scripts_at_its_top_and_no_private_folder(bundle):
    with zipfile.ZipFile(bundle) as z:
        names = z.namelist()
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert names[:2] == ["setup.sh", "run_autograder"]
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    assert "requirements/lab.txt" in names and "grader/manifest.toml" in names
    assert any(n.endswith("/private/hidden.py") for n in names)  # the instructor's own zip
    assert any(n.startswith("solutions/") for n in names)
    assert not [n for n in names if n.startswith(("tests/", ".venv/", ".git/", "work/"))]


def test_a_complete_submission_gets_what_grade_gives(bundle, tmp_path, graded_student):
    make_class(tmp_path / "class", 1)  # student01: the reference solutions
    mine = tmp_path / "ann@example.org"
    (tmp_path / "class" / "student01" / "multigpu").rename(mine)
    results = autograde(bundle, tmp_path, sorted(mine.glob("*.ipynb")))
    report = graded_student(1)
    assert results["score"] == report["max_score"] > 0
    same_as_grade(results, report)


def test_a_broken_submission_loses_only_its_checks_as_in_grade(bundle, tmp_path, graded_student):
    make_class(tmp_path / "class", 3)  # student03: two catalogued mistakes
    mine = tmp_path / "bo@example.org"
    (tmp_path / "class" / "student03" / "multigpu").rename(mine)
    results = autograde(bundle, tmp_path, sorted(mine.glob("*.ipynb")), email="bo@example.org")
    report = graded_student(3)
    assert 0 < results["score"] < report["max_score"]
    same_as_grade(results, report)


def test_the_wrong_notebooks_get_one_clear_message(bundle, tmp_path):
    homework = tmp_path / "homework1.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('hello')")])
    nbformat.write(nb, homework)
    results = autograde(bundle, tmp_path, [homework])
    assert results["score"] == 0 and results["tests"] == []
    assert results["output"].startswith("This submission holds none of the lab's notebooks")
    assert "from_scratch.ipynb" in results["output"] and "homework1.ipynb" in results["output"]


def test_notebooks_zipped_in_their_folders_get_the_same_grade(bundle, tmp_path, graded_student):
    """A student who zips `work/` (Gradescope unpacks it into submission/work/multigpu/),
    with Jupyter's checkpoints and macOS's metadata beside it, is graded as if they had
    uploaded the notebooks themselves, and told which folder was graded."""
    make_class(tmp_path / "class", 3)
    mine = tmp_path / "class" / "student03" / "multigpu"
    upload = tmp_path / "upload"
    shutil.copytree(mine, upload / "work" / "multigpu")
    checkpoints = upload / "work" / "multigpu" / ".ipynb_checkpoints"
    checkpoints.mkdir()
    for notebook in mine.glob("*.ipynb"):  # older saves, named as the lab's notebooks
        shutil.copy(notebook, checkpoints / notebook.name)
    (upload / "__MACOSX" / "work" / "multigpu").mkdir(parents=True)
    (upload / "__MACOSX" / "work" / "multigpu" / "from_scratch.ipynb").write_bytes(b"\0\5\26\7")
    results = autograde(bundle, tmp_path, [upload / "work", upload / "__MACOSX"])
    same_as_grade(results, graded_student(3))
    assert "The notebooks graded are those in work/multigpu of your upload." in results["output"]


def ending(tmp_path, how: str) -> dict:
    """AUTOGRADER_PYTHON for run_autograder: this checkout's Python, except that
    gradescope-run ends as `how` (shell lines) says, before it writes any results."""
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/usr/bin/env bash\n"
        f'if [[ "$3" == gradescope-run ]]; then\n{how}\nfi\n'
        f'exec {python()} "$@"\n'
    )
    wrapper.chmod(0o755)
    return {"AUTOGRADER_PYTHON": str(wrapper)}


def test_a_grader_killed_for_memory_leaves_a_result_that_says_so(bundle, tmp_path):
    """Gradescope's default 768 MB is too little (make images shows the real kill): where the
    grader is killed, the student reads that their work was not graded, and the instructor
    what to raise, in place of Gradescope's bare failure."""
    make_class(tmp_path / "class", 1)
    notebooks = sorted((tmp_path / "class" / "student01" / "multigpu").glob("*.ipynb"))
    results = autograde(bundle, tmp_path, notebooks, env=ending(tmp_path, "kill -9 $$"))
    assert results["score"] == 0 and results["tests"] == []
    said = results["output"]
    assert said.startswith("The autograder stopped before it finished") and "memory" in said
    assert "this score of 0 is not your grade" in said
    assert "Instructor: give the autograder 3 GB of memory or more" in said


def test_a_grader_the_kernel_kills_for_memory_leaves_a_result_that_says_so(bundle, tmp_path):
    """Under Gradescope's default limits, 768 MB and half a CPU, in a cgroup of its own: the
    kernel kills the grader, nothing it started lives on, so the step after it has the
    memory to write results.json. (Children that lived on while they imported torch took
    that memory, and the student got Gradescope's bare failure.)"""
    group = LimitedGroup(memory=768 * 2**20, cpus=0.5)
    try:
        make_class(tmp_path / "class", 1)
        notebooks = sorted((tmp_path / "class" / "student01" / "multigpu").glob("*.ipynb"))
        env = {"GRADER_WARM_SECONDS": "0"}  # as on Gradescope: one grade, no server to keep
        results = autograde(bundle, tmp_path, notebooks, env=env, prefix=group.prefix())
        assert group.kills() >= 1, "the kernel killed nothing: the test did not run out"
    finally:
        group.remove()
    assert results["score"] == 0 and results["tests"] == []
    said = results["output"]
    assert said.startswith("The autograder stopped before it finished") and "memory" in said


def test_the_grader_counts_the_memory_killers_kills_in_its_own_cgroup():
    """gradescope-run writes no score where the kernel ended one of its processes for the
    container's memory (a child or a rank, the grader left alive: the checks it cost are not
    the student's to lose). It reads the count from its own cgroup, here one whose sleeping
    process the kernel is made to kill."""
    group = LimitedGroup()
    count = [*group.prefix(), python(), "-c",
             "from grader.front.gradescope import memory_kills; print(memory_kills())"]  # fmt: skip
    try:
        sleeper = subprocess.Popen([*group.prefix(), python(), "-c", "import time; time.sleep(60)"])
        before = subprocess.run(count, capture_output=True, text=True, timeout=120).stdout.strip()
        group.run_out(sleeper.pid)
        sleeper.wait(timeout=60)
        after = subprocess.run(count, capture_output=True, text=True, timeout=120).stdout.strip()
        killed = group.kills()
    finally:
        group.remove()
    assert before.isdigit(), before  # (it found its cgroup's count)
    assert killed >= 1 and int(after) == int(before) + killed, (before, after, killed)


def test_a_grader_that_fails_leaves_its_last_lines_in_the_students_language(bundle, tmp_path):
    chinese = sorted((EXERCISES.parent / "zh_CN" / EXERCISES.name).glob("*.ipynb"))
    assert [p.name for p in chinese] == sorted(load_manifest().notebooks)
    how = "echo 'Traceback: something went wrong'\nexit 3"
    results = autograde(bundle, tmp_path, chinese, env=ending(tmp_path, how))
    assert results["score"] == 0 and results["tests"] == []
    said = results["output"]
    assert "退出码为3" in said and "Traceback: something went wrong" in said
