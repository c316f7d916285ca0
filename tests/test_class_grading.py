"""Grading a class: full marks for the reference and none for the stubs, the report and the
exports in their formats, progress, resuming, and nothing lost on Ctrl-C."""

import csv
import io
import json
import re
import shutil
import signal
import subprocess
import threading
import time

import jsonschema
import pytest

from grader.base.results import SubmissionResult
from grader.class_grading import ClassOptions, Outputs, Progress, grade_class
from grader.judge.registry import assignment_points, exercise_points
from grader.load.submission import Submission
from grader.manifest import REPO, load_manifest
from grader.report.exports import summary_table
from grader.report.json_report import read_json
from grader.sandbox.fast.spare_cores import SpareCores
from tests.conftest import EXERCISES, SOLUTIONS, python

MANIFEST = load_manifest()
SCHEMA = json.loads((REPO / "tests" / "schemas" / "gradescope-results.schema.json").read_text())
FAST = ["-e", "try_gpu", "-e", "try_all_gpus"]  # two quick exercises keep these tests short


def make_class(root, names):
    for i, name in enumerate(names):
        source = SOLUTIONS if i % 2 == 0 else EXERCISES
        shutil.copytree(source, root / name / MANIFEST.assignment)
    return root


def grade(*args, **kwargs):
    return subprocess.run(
        [python(), "-m", "grader", "grade", *args],
        capture_output=True,
        text=True,
        timeout=900,
        **kwargs,
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    make_class(root / "submitted", ["ann", "ben"])
    proc = grade(
        str(root / "submitted"),
        "--json",
        str(root / "r.json"),
        "--csv",
        str(root / "grades.csv"),
        "--gradescope",
        str(root / "gs"),
        "--jobs",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    return root, proc


@pytest.fixture(scope="module")
def report(exported):
    """The report of the class above: ann's reference solutions, then ben's released stubs."""
    root, _ = exported
    return json.loads((root / "r.json").read_text())["submissions"]


def test_reference_solutions_get_full_marks(report):
    solutions = report[0]
    assert solutions["max_score"] == assignment_points()
    assert solutions["score"] == solutions["max_score"], [
        (e["name"], c["name"], c["message"])
        for e in solutions["exercises"]
        for c in e["checks"]
        if not c["passed"]
    ]


def test_stubs_score_zero_on_every_check(report):
    stubs = report[1]
    assert stubs["score"] == 0
    assert stubs["max_score"] == assignment_points()
    for exercise in stubs["exercises"]:
        for check in exercise["checks"]:
            assert not check["passed"]
            assert "not written yet" in check["message"] or "not judged until" in check["message"]


def test_report_has_the_documented_fields(report):
    for submission in report:
        assert {"id", "score", "max_score", "exercises"} <= submission.keys()
        assert [e["name"] for e in submission["exercises"]] == [ex.id for ex in MANIFEST.exercises]
        for exercise in submission["exercises"]:
            assert {"name", "score", "max_score", "checks"} <= exercise.keys()
            assert exercise["max_score"] == exercise_points(MANIFEST.exercise(exercise["name"]))
            for check in exercise["checks"]:
                assert {"name", "passed", "points", "message", "hint"} <= check.keys()


def test_submission_ids_come_from_folder_names(report):
    assert [s["id"] for s in report] == ["ann", "ben"]


def test_gradescope_files_follow_the_documented_fields(exported):
    root, _ = exported
    for student in ("ann", "ben"):
        data = json.loads((root / "gs" / student / "results.json").read_text())
        jsonschema.validate(data, SCHEMA)
        assert data["score"] == sum(t["score"] for t in data["tests"])


def test_hidden_checks_are_hidden_on_gradescope(exported):
    root, _ = exported
    tests = json.loads((root / "gs" / "ann" / "results.json").read_text())["tests"]
    hidden = {t["name"] for t in tests if t["visibility"] == "hidden"}
    assert "allreduce: matches_the_reference_on_random_lists" in hidden
    assert "allreduce: book_demo_gives_threes_on_both_devices" not in hidden


def test_the_csv_gradebook_has_a_row_per_student_and_a_column_per_exercise(exported):
    root, _ = exported
    rows = list(csv.reader((root / "grades.csv").open(newline="")))
    assert rows[0] == ["student", *(ex.id for ex in MANIFEST.exercises), "total", "max_score"]
    table = {row[0]: row for row in rows[1:]}
    assert table["ann"][-2:] == [f"{assignment_points():g}"] * 2
    assert table["ben"][-2] == "0"


def test_the_run_ends_with_a_summary_table(exported):
    _, proc = exported
    assert re.search(r"^exercise +mean +max +full marks$", proc.stdout, re.M)
    assert re.search(r"^allreduce +5\.5 +11 +1/2$", proc.stdout, re.M)


@pytest.mark.slow
def test_a_rerun_skips_what_is_graded_and_regrades_what_changed(tmp_path):
    make_class(tmp_path / "submitted", ["ann", "ben"])
    report = tmp_path / "r.json"
    assert grade(str(tmp_path / "submitted"), "--json", str(report), *FAST).returncode == 0
    first = {r.id: r for r in read_json(report)}
    notebook = tmp_path / "submitted" / "ben" / MANIFEST.assignment / "from_scratch.ipynb"
    notebook.write_text((SOLUTIONS / "from_scratch.ipynb").read_text())
    assert grade(str(tmp_path / "submitted"), "--json", str(report), *FAST).returncode == 0
    second = {r.id: r for r in read_json(report)}
    assert second["ann"] == first["ann"]  # untouched: not graded again
    assert second["ben"].score == 6 and first["ben"].score == 0  # changed: graded again
    assert (
        grade(str(tmp_path / "submitted"), "--json", str(report), *FAST, "--regrade").returncode
        == 0
    )
    assert {r.id: r for r in read_json(report)}["ann"].seconds != first["ann"].seconds


@pytest.mark.slow
def test_an_interrupted_run_keeps_every_finished_submission(tmp_path):
    names = [f"s{i}" for i in range(6)]
    make_class(tmp_path / "submitted", names)
    report = tmp_path / "r.json"
    proc = subprocess.Popen(
        [
            python(),
            "-m",
            "grader",
            "grade",
            str(tmp_path / "submitted"),
            "--json",
            str(report),
            *FAST,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal, even when these tests run in the background (`make test &`),
        # where the shell starts them with SIGINT ignored and the grader would inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(read_json(report)) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    kept = read_json(report)
    assert 2 <= len(kept) < len(names)
    done = {r.id for r in kept}
    rest = grade(str(tmp_path / "submitted"), "--json", str(report), *FAST)
    assert rest.returncode == 0
    final = {r.id: r for r in read_json(report)}
    assert set(final) == set(names)
    assert all(final[i].seconds == next(r for r in kept if r.id == i).seconds for i in done)


def test_progress_shows_done_running_and_left():
    out = io.StringIO()
    progress = Progress(5, out)
    result = SubmissionResult("alice", "x", 3.0, 6.0)
    progress.show(2, 2, result)
    assert out.getvalue() == "alice: 3/6 (2/5 graded, 2 running, 1 left)\n"


def test_progress_redraws_one_line_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    progress = Progress(4, out)
    progress.show(1, 1)
    progress.show(4, 0)
    assert out.getvalue().startswith("\r[######------------------] 1/4 graded, 1 running, 2 left")
    assert out.getvalue().endswith("4/4 graded, 0 running, 0 left\n")


def test_summary_table_of_no_submissions():
    assert summary_table([], MANIFEST, {}) == "no submissions"


def test_grade_reports_its_sandbox(exported):
    _, proc = exported
    assert "sandbox: " in proc.stdout.splitlines()[0]


def test_spare_cores_say_idle_only_for_a_long_enough_idle_look(monkeypatch):
    """One more child or submission starts only when, over half a second or more, the cores
    were idle for three quarters of a core on average; each such look starts the count anew."""
    readings = iter([(0.0, 10.0), (0.2, 10.2), (1.0, 10.6), (2.0, 11.4), (2.5, 12.0)])
    monkeypatch.setattr(SpareCores, "read", lambda self: next(readings))
    spare = SpareCores()  # the first reading
    assert not spare.idle()  # 0.2 s later: too soon to say
    assert not spare.idle()  # 0.6 core idle over 1 s
    assert spare.idle()  # 0.8 of a core over the second after that: room for one more
    assert spare.idle()  # 1.2 cores over the half second since


def test_a_class_grades_more_at_once_only_while_the_cores_sit_idle(monkeypatch, tmp_path):
    """--jobs N runs N submissions at a time, and up to twice N while the cores sit idle (a
    submission waiting for a deadlock verdict, say); busy cores get no more."""
    import grader.class_grading as grade_class_module

    running, most = [0], [0]
    lock = threading.Lock()

    def grade_submission(sub, options):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return SubmissionResult(sub.id, str(sub.path), 1.0, 1.0)

    class Spare:
        def __init__(self, idle):
            self.answer = idle

        def idle(self, share=0.75):
            return self.answer

    import grader.sandbox.fast.spare_cores as spare_cores

    monkeypatch.setattr(grade_class_module, "grade_submission", grade_submission)
    subs = [Submission(f"s{i}", tmp_path, {}, []) for i in range(8)]
    for idle, expected in ((False, 2), (True, 4)):
        monkeypatch.setattr(spare_cores, "spare_cores", lambda idle=idle: Spare(idle))
        most[0] = 0
        options = ClassOptions(jobs=2, regrade=True)
        results = grade_class(subs, Outputs(), options, progress=lambda *a: None)
        assert [r.id for r in results] == [s.id for s in subs]
        assert most[0] == expected


def test_the_last_submissions_of_a_class_get_the_cores_the_others_leave(monkeypatch, tmp_path):
    """With --jobs 2, a submission grades its notebooks on its share of the cores while
    another is graded or waits; the last one left, on all of them."""
    import grader.class_grading as grade_class_module
    from grader.grading import notebooks_at_once

    shares: dict[str, list[int]] = {}

    def grade_submission(sub, options):
        shares[sub.id] = [options.at_once.now]
        time.sleep({"s0": 0.1, "s1": 1.0, "s2": 2.0}[sub.id])  # s2 starts as s0 ends
        shares[sub.id].append(options.at_once.now)
        return SubmissionResult(sub.id, str(sub.path), 1.0, 1.0)

    monkeypatch.setattr(grade_class_module, "grade_submission", grade_submission)
    subs = [Submission(f"s{i}", tmp_path, {}, []) for i in range(3)]
    grade_class(subs, Outputs(), ClassOptions(jobs=2, regrade=True), progress=lambda *a: None)
    shared, alone = notebooks_at_once(2), notebooks_at_once(1)
    assert shares["s0"] == [shared, shared] and shares["s1"][0] == shared
    assert shares["s2"] == [shared, alone]  # s1 ended while s2 ran
