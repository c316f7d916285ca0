"""What the grader prints reaches whoever reads it, whatever its standard output is: a
terminal, a file, a pipe closed early, or nothing at all; and the reports are written
all the same."""

import io
import os
import subprocess
import sys
import threading

import pytest

from grader.base.printed import captured
from tests.test_class_grading import grade, make_class


def test_a_thread_that_captures_leaves_the_others_output_alone(capsys):
    """Loading a reference in the background captures that thread's prints only: the
    class's summary, printed meanwhile, still reaches the terminal."""
    inside, done = threading.Event(), threading.Event()
    buffer = io.StringIO()

    def background() -> None:
        with captured(buffer):
            print("the reference's demo output")
            inside.set()
            done.wait(10)

    thread = threading.Thread(target=background)
    thread.start()
    assert inside.wait(10)
    print("alice: 19/19")
    done.set()
    thread.join()
    assert capsys.readouterr().out == "alice: 19/19\n"
    assert buffer.getvalue() == "the reference's demo output\n"
    assert not type(sys.stdout).__name__.startswith("_PerThread")


def test_a_process_forked_while_capturing_prints_to_its_own_output():
    """A rank forked while its parent captures starts with the streams the parent had before
    it captured, not the capture's stand-in, whose buffer in the rank is a copy nobody reads."""
    out, err = sys.stdout, sys.stderr
    read, write = os.pipe()
    with captured(io.StringIO()):
        pid = os.fork()
        if pid == 0:  # the rank: it says what it prints to, and leaves (never into pytest)
            code = 3
            try:
                os.close(read)
                said = f"{sys.stdout is out} {sys.stderr is err} {type(sys.stdout).__name__}"
                os.write(write, said.encode())
                code = 0
            finally:
                os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the rank failed, having said {said!r}"
    assert said == f"True True {type(out).__name__}"


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("output")
    make_class(root / "submitted", ["ann", "ben"])
    args = [str(root / "submitted"), "-e", "split_batch", "--json", str(root / "r.json")]
    first = grade(*args)
    assert first.returncode == 0, first.stderr
    return root, args, first.stdout


@pytest.mark.slow
def test_regrading_into_a_file_prints_everything_every_time(graded_class):
    """Re-grading (every submission already in the report: nothing left to wait for) raced
    with loading in the background, and lost the summary in 10 of 26 runs into a file."""
    root, args, printed = graded_class
    lines = printed.splitlines()
    assert lines[-1].startswith("report written to")
    for run in range(15):
        with open(root / "out.txt", "w") as out:
            proc = subprocess.run(
                [sys.executable, "-m", "grader", "grade", *args],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                timeout=300,
            )
        assert proc.returncode == 0, proc.stderr
        again = (root / "out.txt").read_text().splitlines()
        assert again[-1] == lines[-1], f"run {run}: printed only {again}"
        assert [x for x in again if x.startswith(("ann:", "ben:"))] == ["ann: 8/8", "ben: 0/8"]


@pytest.mark.slow
def test_with_standard_output_closed_the_reports_are_written(graded_class):
    root, args, _ = graded_class
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "grade", *args, "--csv", str(root / "closed.csv")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode == 0, proc.stderr
    assert "ann,,,,,8," in (root / "closed.csv").read_text()


@pytest.mark.slow
def test_a_reader_that_leaves_early_costs_no_report(graded_class):
    """`grade ... | head -1`: the rest of the output has nowhere to go, but the command ends
    well and writes every report."""
    root, args, _ = graded_class
    proc = subprocess.Popen(
        [sys.executable, "-m", "grader", "grade", *args, "--csv", str(root / "piped.csv")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes
    _, errors = proc.communicate(timeout=300)
    assert proc.returncode == 0, errors.decode()
    assert b"BrokenPipeError" not in errors
    assert "ann,,,,,8," in (root / "piped.csv").read_text()
