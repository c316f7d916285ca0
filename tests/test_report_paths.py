"""Report paths of `python -m grader grade` mean what they mean to a Unix user: `-` and
`/dev/stdout` are standard output, a symlink is written through and kept, a device or a
FIFO is written directly and never read back, and a path that cannot be written is one clear
error before any grading; alike in the warm server and without it, as root and as a user
without privileges (grader.report.paths)."""

import functools
import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader.report.json_report import read_json
from grader.report.paths import (
    ReportPathError,
    is_stream,
    readable_report,
    umask,
    validate_report_paths,
    write_report,
)
from grader.sandbox.fast import warm_client
from tests.conftest import SOLUTIONS, python

NOTEBOOK = str(SOLUTIONS / "from_scratch.ipynb")
ONE = ["-e", "try_gpu"]  # one quick exercise keeps each grade to a few seconds
NOBODY = 65534


# ---- the writing itself -----------------------------------------------------------------


def test_a_symlink_is_written_through_and_kept_its_targets_mode_too(tmp_path):
    target = tmp_path / "real" / "report.json"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_report(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real"]
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]  # no temporary left


def test_a_dangling_symlink_makes_its_target(tmp_path):
    link = tmp_path / "link.csv"
    link.symlink_to(tmp_path / "made.csv")
    write_report(link, "a,b\n")
    assert link.is_symlink() and (tmp_path / "made.csv").read_text() == "a,b\n"


def test_a_new_report_gets_the_mode_the_umask_gives(tmp_path):
    write_report(tmp_path / "r.json", "{}")
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o666 & ~umask()


def test_a_device_is_written_directly_and_never_replaced(tmp_path):
    before = os.lstat("/dev/null")
    write_report("/dev/null", "report\n")
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert is_stream("/dev/null") and not readable_report("/dev/null")


def fifo_reader(path: Path) -> tuple[threading.Thread, list[bytes]]:
    """Start reading the FIFO `path` to its end in a thread; return it and what it read."""
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, got


def test_a_fifo_is_written_directly_and_never_read_back(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_json(fifo) == []  # returns at once: nothing is opened
    reader, got = fifo_reader(fifo)
    write_report(fifo, '{"submissions": []}\n')
    reader.join(10)
    assert got == [b'{"submissions": []}\n']
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_standard_output_is_never_read_back():
    for name in ("-", "/dev/stdout"):
        assert is_stream(name) and not readable_report(name) and read_json(name) == []


@pytest.mark.parametrize(
    "files, said",
    [
        ({"--json": "-", "--csv": "/dev/stdout"}, "--json, --csv each ask for standard output"),
        ({"--json": "{tmp}/missing/r.json"}, "the folder {tmp}/missing does not exist"),
        ({"--json": "{tmp}"}, "is a folder; name a file in it, such as {tmp}/report.json"),
        ({"--csv": "{tmp}/file/g.csv"}, "{tmp}/file is not a folder"),
        ({"--json": "{tmp}/same", "--csv": "{tmp}/same"}, "--json and --csv both write"),
    ],
)
def test_what_cannot_be_written_says_why(tmp_path, files, said):
    (tmp_path / "file").write_text("")
    with pytest.raises(ReportPathError, match=said.format(tmp=tmp_path)):
        validate_report_paths({k: Path(v.format(tmp=tmp_path)) for k, v in files.items()})


def test_folders_and_databases_do_not_go_to_a_stream(tmp_path):
    for option in ("--gradescope", "--gradebook"):
        kind = {"--gradescope": "folders", "--gradebook": "databases"}[option]
        with pytest.raises(ReportPathError, match="not to a stream"):
            validate_report_paths({}, **{kind: {option: Path("-")}})
    with pytest.raises(ReportPathError, match="each ask for standard output"):
        validate_report_paths({"--json": Path("-")}, streams={"--feedback": Path("/dev/stdout")})
    validate_report_paths({"--json": Path("-")}, streams={"--feedback": tmp_path / "fb"})


# ---- the command line, in the warm server and without it --------------------------------


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """A folder every user may enter (a test's own folder is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="rp-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def unprivileged() -> tuple[list[str], dict] | None:
    """Return how to run a command as a user without privileges: a prefix and arguments of
    subprocess.run. As root: `nobody` where it can run this Python, else an unprivileged
    user namespace (uid nobody, no capabilities over files it does not own); None where
    neither can run."""
    if os.geteuid() != 0:
        return [], {}
    as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    for prefix, options in (([], as_nobody), (["unshare", "--user"], {})):
        try:
            with_it = subprocess.run(
                [*prefix, python(), "-c", "import os; print(os.getuid())"],
                capture_output=True,
                text=True,
                timeout=60,
                **options,
            )
        except OSError:  # (it may not run this Python, in a folder only root may enter)
            continue
        if with_it.returncode == 0 and with_it.stdout.strip() == str(NOBODY):
            return prefix, options
    return None


WAYS = ["root, alone", "root, warm", "nobody, alone", "nobody, warm"]


@pytest.fixture(scope="module", params=WAYS)
def grade(request, base):
    """Run `python -m grader grade NOTEBOOK -e try_gpu ARGS...` one way: as root or without
    privileges, in a warm server (one answers already) or alone; `cwd` is its folder. The
    function's `way` says which."""
    way = request.param
    env = {**os.environ, "GRADER_WARM_SECONDS": "0"}
    prefix, options = [], {}
    shared = base / way.replace(", ", "-")  # its home, its warm servers' folder
    shared.mkdir()
    shared.chmod(0o1777)
    if way.startswith("nobody"):
        found = unprivileged()
        if found is None:
            pytest.skip("no way to run a command without privileges here")
        prefix, options = found
        env |= {"HOME": str(shared), "MPLCONFIGDIR": str(shared / "mpl")}
    warm = shared / "warm"
    if way.endswith("warm"):
        env |= {"GRADER_WARM_DIR": str(warm), "GRADER_WARM_SECONDS": "120"}

    def run(*args: str, cwd: Path = base, **more) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*prefix, python(), "-m", "grader", "grade", NOTEBOOK, *ONE, *args],
            capture_output="stdout" not in more,
            text=True,
            timeout=600,
            env=env,
            cwd=cwd,
            **options,
            **more,
        )

    run.way = way
    if way.endswith("warm"):
        started = run()
        assert started.returncode == 0, started.stderr
        assert len(warm_client.warm_servers(warm)) == 1  # the next commands run in it
    yield run
    warm_client.stop_warm(warm)
    shutil.rmtree(warm.with_name("warm-cache"), ignore_errors=True)


@pytest.fixture
def place(base) -> Iterator[Path]:
    """A fresh folder that the grading user may write into."""
    folder = Path(tempfile.mkdtemp(dir=base))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def stdout_link() -> tuple[str, int]:
    """Return where /dev/stdout leads and what it is (a symlink, a device), to compare."""
    found = os.lstat("/dev/stdout")
    return (os.readlink("/dev/stdout") if stat.S_ISLNK(found.st_mode) else ""), found.st_mode


def test_dash_and_dev_stdout_are_standard_output_even_into_a_pipe(grade, place):
    before = stdout_link()
    for name in ("/dev/stdout", "-", "/dev/stdout"):  # the last finds a report there
        proc = grade("--json", name, cwd=place)
        assert proc.returncode == 0, proc.stderr
        (graded,) = json.loads(proc.stdout)["submissions"]  # its standard output: the report
        assert graded["score"] == graded["max_score"] > 0
        assert "from_scratch: 3/3" in proc.stderr  # what else it says goes to stderr
    assert stdout_link() == before
    assert list(place.iterdir()) == []  # no file called `-`, nothing else


def test_dev_stdout_into_a_file_holds_the_report_alone(grade, place):
    out = place / "out.json"
    with open(out, "w") as f:
        proc = grade("--csv", "/dev/stdout", stdout=f, stderr=subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("student,try_gpu,")
    with open(place / "feedback.md", "w") as f:  # every submission's feedback, one after another
        proc = grade("--feedback", "-", stdout=f, stderr=subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr
    assert (place / "feedback.md").read_text().startswith("# Feedback for from_scratch\n")
    assert sorted(p.name for p in place.iterdir()) == ["feedback.md", "out.json"]


def test_a_symlinked_report_stays_a_symlink_and_relative_paths_and_umask_are_its_own(grade, place):
    (place / "real").mkdir()
    (place / "real").chmod(0o1777)
    (place / "link.csv").symlink_to("real/g.csv")
    proc = grade("--json", "r.json", "--csv", "link.csv", cwd=place, umask=0o027)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((place / "r.json").stat().st_mode) == 0o640  # the command's umask
    assert json.loads((place / "r.json").read_text())["submissions"][0]["id"] == "from_scratch"
    assert (place / "link.csv").is_symlink() and os.readlink(place / "link.csv") == "real/g.csv"
    assert (place / "real" / "g.csv").read_text().startswith("student,try_gpu,")
    assert sorted(p.name for p in place.iterdir()) == ["link.csv", "r.json", "real"]
    again = grade("--json", "r.json", "--csv", "link.csv", cwd=place)  # replaced once more
    assert again.returncode == 0 and (place / "link.csv").is_symlink()


def test_a_fifo_and_a_device_are_written_directly_never_read(grade, place):
    fifo = place / "fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    reader, got = fifo_reader(fifo)
    proc = grade("--json", str(fifo), "--csv", "/dev/null", cwd=place)
    reader.join(60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(got[0])["submissions"][0]["id"] == "from_scratch"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def refused(proc: subprocess.CompletedProcess, said: str) -> None:
    """Assert that the grade stopped with a usage error saying `said`, having graded nothing."""
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr
    assert proc.stderr.count("error:") == 1
    assert "grading" not in proc.stderr + proc.stdout


def test_what_cannot_be_written_stops_the_grade_before_it_starts(grade, place):
    (place / "dir").mkdir()
    refused(grade("--json", "-", "--csv", "/dev/stdout"), "--json, --csv each ask for standard")
    refused(grade("--json", str(place / "no" / "r.json")), f"the folder {place}/no does not")
    refused(grade("--csv", str(place / "dir")), "is a folder; name a file in it")
    refused(grade("--gradebook", "-"), "not to a stream")
    refused(grade("--feedback", "-", "--json", "/dev/stdout"), "each ask for standard output")
    assert sorted(p.name for p in place.iterdir()) == ["dir"] and not any((place / "dir").iterdir())


def test_a_folder_the_user_cannot_write_stops_the_grade_before_it_starts(grade, place):
    closed = place / "closed"
    closed.mkdir()
    report = closed / "r.json"
    report.write_text("kept")
    os.chown(closed, NOBODY, NOBODY)
    os.chown(report, NOBODY, NOBODY)
    closed.chmod(0o555)  # nobody, its owner, may not write in it; others neither
    report.chmod(0o444)
    proc = grade("--json", str(closed / "new.json"), cwd=place)
    if grade.way.startswith("root"):  # root may write anywhere: the report is written
        assert proc.returncode == 0, proc.stderr
        assert json.loads((closed / "new.json").read_text())["submissions"]
        return
    refused(proc, f"no permission to write into the folder {closed}")
    refused(grade("--csv", str(report), cwd=place), "no permission to write to it")
    assert report.read_text() == "kept" and sorted(os.listdir(closed)) == ["r.json"]
