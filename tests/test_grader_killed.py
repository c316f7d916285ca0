"""Nothing outlives the grader. Killed mid-grade, by a signal or by the kernel's memory
killer, and on each start path (children started afresh, forked by the fork server, or the
command run in the warm server), its children, their ranks and its fork server end with
it. So do they when it is killed while they are still starting (importing torch), and a
fork server's children when the kernel kills the server. Processes that lived on held the
memory that the grader's own report needed: under Gradescope's 768 MB, the command that
writes `results.json` after a kill was killed in turn, and the student got no result."""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cgroups import LimitedGroup, alive, children_of, tree
from tests.conftest import python

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
STARTS = ["spawn", "fork", "warm"]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def _depth(pid: int, top: int) -> int:
    """How many parents up from `pid` to `top` (0 where `top` is not above it)."""
    depth = 0
    while pid not in (top, 0, 1):
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return 0
        depth += 1
    return depth if pid == top else 0


def ranks_run(below: set[int], top: int) -> bool:
    """A child and the ranks it forked (grandchildren of a child) are among `below`."""
    return len(below) >= 4 and any(_depth(p, top) >= 2 for p in below)


def a_child_starts(below: set[int], top: int) -> bool:
    """A grading child, or the fork server that is to fork them, has started below `top`
    (in the warm server: a child of one of its sessions)."""
    return any(b"grader.sandbox" in _cmdline(p) or _depth(p, top) >= 2 for p in below)


@pytest.fixture
def memory_group() -> Iterator[LimitedGroup]:
    group = LimitedGroup()
    yield group
    group.remove()


# ---- a grade, killed -----------------------------------------------------------------------


@contextlib.contextmanager
def a_grade(start: str, tmp_path: Path, prefix: list[str] | None = None):
    """Start `grade` of the reference distributed notebook on the start path `start`; yield
    the grader's process and the process whose tree holds its children (the warm server,
    for "warm"). Whatever is left is killed afterwards."""
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "distributed.ipynb").write_bytes(
        (REPO / "solutions" / "multigpu" / "distributed.ipynb").read_bytes()
    )
    # The warm server's socket lies in this folder: a short path (a Unix socket's is limited
    # to 108 bytes, which pytest's temporary folders under xdist can pass).
    warm = Path(tempfile.mkdtemp(prefix="killed-"))
    env = dict(
        os.environ,
        GRADER_START="spawn" if start == "spawn" else "fork",
        GRADER_WARM_SECONDS="300" if start == "warm" else "0",
        GRADER_WARM_DIR=str(warm),
    )
    command = [python(), "-m", "grader", "grade", str(submission), "--json", "report.json"]
    server = None
    if start == "warm":  # a first grade starts the warm server, which the next runs in
        first = [*command[:-1], "first.json"]  # (a report's graded submissions are kept)
        subprocess.run(first, cwd=tmp_path, env=env, capture_output=True, timeout=600)
        servers = [p for p in tree(1) if b"--warm " + str(warm).encode() in _cmdline(p)]
        assert len(servers) == 1, f"the first grade left {len(servers)} warm servers, not one"
        server = servers[0]
    grader = subprocess.Popen([*(prefix or []), *command], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        yield grader, server or grader.pid
    finally:
        for pid in alive(tree(server or grader.pid) - {server}):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if server is not None:
            with contextlib.suppress(OSError):
                os.kill(server, signal.SIGTERM)
        shutil.rmtree(warm, ignore_errors=True)


def wait_for(moment: Callable[[set[int], int], bool], grader, top: int) -> set[int]:
    """Wait until `moment` holds of the processes below `top`; return all seen below it."""
    seen: set[int] = set()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and grader.poll() is None:
        now = tree(top) - {top}
        seen |= now
        if moment(now, top):
            return seen
        time.sleep(0.05)
    raise AssertionError("the grade ended, or took 300 s, before the moment to kill it came")


def frozen(grader) -> None:
    """Stop every process below the grader (SIGSTOP): as a child busy importing torch, none
    can end itself when the grader goes, so the kernel must end them. (A session of the warm
    server is not below the grader: it ends itself when the grader's connection closes.)"""
    for pid in tree(grader.pid) - {grader.pid}:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGSTOP)


def nothing_left(seen: set[int]) -> None:
    deadline = time.monotonic() + 20
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = alive(seen)
    said = {p: _cmdline(p)[:120] for p in left}
    for pid in left:  # (stopped by `frozen`, they would wait for ever)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, said


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "memory"])
def test_a_grader_killed_mid_grade_leaves_no_process_behind(start, how, tmp_path, request):
    group = request.getfixturevalue("memory_group") if how == "memory" else None
    with a_grade(start, tmp_path, group.prefix() if group else None) as (grader, top):
        seen = wait_for(ranks_run, grader, top)
        time.sleep(1)
        seen |= tree(top) - {top}
        frozen(grader)
        if group is None:
            grader.send_signal(getattr(signal, how))
        else:
            group.run_out(grader.pid)
        assert grader.wait(timeout=60) == -getattr(signal, "SIGKILL" if group else how)
        if group is not None:
            assert group.kills() >= 1, "the kernel killed nothing for memory"
        nothing_left(seen)


@pytest.mark.parametrize("start", STARTS)
def test_a_grader_killed_while_its_children_start_leaves_none_behind(start, tmp_path):
    """Killed while a child (or the fork server) is still importing: the first moment a
    grading process exists below it."""
    with a_grade(start, tmp_path) as (grader, top):
        seen = wait_for(a_child_starts, grader, top)
        frozen(grader)
        grader.kill()
        grader.wait()
        nothing_left(seen | (tree(top) - {top}))


def test_a_fork_server_killed_takes_its_children_and_their_ranks_with_it(tmp_path):
    """The kernel may kill the fork server for memory, in place of the grader (it is the
    larger): the children it forked, in sessions of their own, end with it."""
    with a_grade("fork", tmp_path) as (grader, top):
        wait_for(ranks_run, grader, top)
        servers = [p for p in children_of().get(top, []) if b"fast.forkserver" in _cmdline(p)]
        assert len(servers) == 1, "the grader started no fork server, or more than one"
        below = tree(servers[0]) - {servers[0]}
        assert below, "the fork server had forked no child"
        for pid in below:  # (as in `frozen`)
            os.kill(pid, signal.SIGSTOP)
        os.kill(servers[0], signal.SIGKILL)
        nothing_left(below)
