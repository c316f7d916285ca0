"""Limits stop loops and waits, never slow correct code: a busy machine, or a limit set far
too low, costs the reference solutions nothing."""

import json
import shutil
import subprocess
import sys

import pytest

from grader.judge.registry import exercise_points
from grader.manifest import load_manifest
from tests.conftest import SOLUTIONS, python, write_notebook
from tests.test_hostile import replacing, score

MANIFEST = load_manifest()

# Every test here starts graders.
pytestmark = pytest.mark.slow


def grade(target, *options, timeout=1800) -> dict:
    """Grade `target` with the command line; return the report's submissions by id."""
    out = target.parent / f"{target.name}.json"
    proc = subprocess.run(
        [python(), "-m", "grader", "grade", str(target), "--json", str(out), *options],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {s["id"]: s for s in json.loads(out.read_text())["submissions"]}


def messages(sub, exercise) -> str:
    return " ".join(
        c["message"] for e in sub["exercises"] if e["name"] == exercise for c in e["checks"]
    )


LOADED_EXERCISES = (
    "train_batch",
    "train_loop",
    "train_dataparallel",
    "ring_allreduce",
    "train_ddp",
)


def test_the_reference_keeps_full_marks_on_a_loaded_machine(tmp_path):
    """Four busy loops, each in a session of its own, load the two cores while the reference
    solutions are graded two submissions at a time (three processes or more to a core): the
    first two notebooks in one, the distributed notebook (whose process groups must not look
    deadlocked when starved) in the other. The exercises graded are those that compute the
    most, the trainings and the ring's many process groups: the ones a starved child could
    make look stuck, or slower than the reference."""
    for name, notebooks in (
        ("first", ["from_scratch.ipynb", "concise.ipynb"]),
        ("second", ["distributed.ipynb"]),
    ):
        folder = tmp_path / "class" / name / MANIFEST.assignment
        folder.mkdir(parents=True)
        for notebook in notebooks:
            shutil.copy(SOLUTIONS / notebook, folder / notebook)
    loops = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(4)
    ]
    try:
        only = [arg for ex in LOADED_EXERCISES for arg in ("-e", ex)]
        report = grade(tmp_path / "class", "--jobs", "2", *only, timeout=3000)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert report, "the report has no submission"
    for name, sub in report.items():
        handed_in = {p.name for p in (tmp_path / "class" / name / MANIFEST.assignment).iterdir()}
        failed = [
            (e["name"], c["name"], c["message"])
            for e in sub["exercises"]
            if MANIFEST.exercise(e["name"]).notebook in handed_in
            for c in e["checks"]
            if not c["passed"]
        ]
        assert failed == []
        assert sub["score"] == sum(
            exercise_points(ex)
            for ex in MANIFEST.exercises
            if ex.notebook in handed_in and ex.id in LOADED_EXERCISES
        )


def test_a_limit_set_far_too_low_costs_correct_code_nothing(tmp_path):
    """With half a second per check, the training cases outrun the limit; timed against the
    reference on this machine, they run again with room, and keep their points."""
    target = tmp_path / "reference" / MANIFEST.assignment
    shutil.copytree(SOLUTIONS, target)
    (sub,) = grade(target, "-e", "train_loop", "--check-timeout", "0.5").values()
    assert score(sub, "train_loop") == exercise_points(MANIFEST.exercise("train_loop")), messages(
        sub, "train_loop"
    )


def test_an_endless_loop_is_stopped_and_set_against_the_reference(tmp_path):
    folder = tmp_path / "loopy" / MANIFEST.assignment
    cells = replacing("try_all_gpus", "def try_all_gpus():\n    while True:\n        pass")
    write_notebook(folder / "from_scratch.ipynb", *cells)
    (sub,) = grade(folder, "-e", "try_all_gpus", "--check-timeout", "1").values()
    assert score(sub, "try_all_gpus") == 0
    said = messages(sub, "try_all_gpus")
    assert "time limit of 1 s of processor time per check" in said
    assert "the reference solution needs 0.0 s of processor time on the same case" in said


def test_code_that_waits_is_stopped_and_grading_goes_on(tmp_path):
    folder = tmp_path / "sleepy" / MANIFEST.assignment
    cells = replacing("try_all_gpus", "def try_all_gpus():\n    import time\n    time.sleep(3600)")
    write_notebook(folder / "from_scratch.ipynb", *cells)
    (sub,) = grade(folder, "-e", "try_all_gpus", "-e", "try_gpu", "--idle-timeout", "3").values()
    assert score(sub, "try_all_gpus") == 0
    assert "computed nothing for 3 s" in messages(sub, "try_all_gpus")
    assert score(sub, "try_gpu") == exercise_points(MANIFEST.exercise("try_gpu"))


SLEEPS_IN_A_RANK = (
    "def ring_allreduce(tensor):\n"
    "    import time\n"
    "    import torch.distributed as dist\n"
    "    if dist.get_rank() == 1:\n"
    "        time.sleep(3600)\n"
    "    dist.all_reduce(tensor)\n"
    "    return tensor"
)


@pytest.mark.parametrize(
    ("options", "seconds"),
    [((), 5), (("--idle-timeout", "2"), 2), (("--group-idle-timeout", "3"), 3)],
)
def test_the_idle_limit_reaches_the_ranks(options, seconds, tmp_path):
    """A rank that sleeps in Python (no early deadlock call: it may wake) is stopped once its
    group has computed nothing for the group's idle limit: 5 s, or less where the child's
    own idle limit is less (the child waiting on it would be stopped then), or as set."""
    folder = tmp_path / "sleepy" / MANIFEST.assignment
    cells = replacing("ring_allreduce", SLEEPS_IN_A_RANK, "distributed.ipynb")
    write_notebook(folder / "distributed.ipynb", *cells)
    (sub,) = grade(folder, "-e", "ring_allreduce", *options).values()
    assert score(sub, "ring_allreduce") == 0
    said = messages(sub, "ring_allreduce")
    assert f"rank 1 computed nothing for {seconds} s" in said, said
