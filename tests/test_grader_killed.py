"""Nothing outlives the grader: killed mid-grade with SIGKILL (as the kernel kills it for
memory), its children and their ranks end with it, whether the children were started afresh,
forked by the fork server, or the command ran in the warm server. Children that lived on would
hold the memory that the grader's own report needs (Gradescope's `results.json`)."""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import python

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def children_of() -> dict[int, list[int]]:
    """Every process's children, read from /proc."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            found.setdefault(parent, []).append(int(entry.name))
    return found


def tree(pid: int) -> set[int]:
    """`pid` and every process below it."""
    kids, found, todo = children_of(), set(), [pid]
    while todo:
        found.add(todo[-1])
        todo.extend(k for k in kids.get(todo.pop(), []) if k not in found)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` that still run (a zombie has ended: only its entry waits)."""
    living = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            living.add(pid)
    return living


@pytest.mark.parametrize("start", ["spawn", "fork", "warm"])
def test_a_grader_killed_mid_grade_leaves_no_process_behind(start, tmp_path):
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
    if start == "warm":  # a first grade starts the warm server, which the next runs in
        first = [*command[:-1], "first.json"]  # (a report's graded submissions are kept)
        subprocess.run(first, cwd=tmp_path, env=env, capture_output=True, timeout=600)
        servers = [p for p in tree(1) if b"--warm " + str(warm).encode() in _cmdline(p)]
        assert len(servers) == 1, f"the first grade left {len(servers)} warm servers, not one"
        server = servers[0]
    grader = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    top = server if start == "warm" else grader.pid
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 300
        # Until ranks run: a child and the ranks it forked (grandchildren of a child).
        while time.monotonic() < deadline and grader.poll() is None:
            now = tree(top) - {top}
            seen |= now
            if len(now) >= 4 and any(_depth(p, top) >= 2 for p in now):
                break
            time.sleep(0.2)
        assert grader.poll() is None, "the grade ended before its ranks were seen"
        time.sleep(1)
        seen |= tree(top) - {top}
        grader.send_signal(signal.SIGKILL)
        grader.wait()
        deadline = time.monotonic() + 20
        while alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = alive(seen)
        assert not left, {p: _cmdline(p)[:120] for p in left}
    finally:
        for pid in alive(tree(top) - ({server} if start == "warm" else set())):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if start == "warm":
            with contextlib.suppress(OSError):
                os.kill(server, signal.SIGTERM)
        shutil.rmtree(warm, ignore_errors=True)


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
