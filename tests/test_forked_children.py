"""Children forked from the warm fork server grade, fail and stay fenced as started ones do."""

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from grader.base.protocol import CaseOutcome, ForkOrder, to_plain
from grader.grading import grade_path
from grader.judge.registry import exercise_points
from grader.manifest import load_manifest
from grader.sandbox.collected import Phases
from grader.sandbox.fast import forkserver
from grader.sandbox.fence import Fence, choose_fence
from tests.conftest import SOLUTIONS, python, write_notebook
from tests.test_hostile import replacing

MANIFEST = load_manifest()
QUICK = ["try_gpu", "allreduce", "split_batch"]


def verdicts(result) -> dict[str, tuple[bool, float, str]]:
    return {
        f"{ex.name}::{c.name}": (c.passed, c.points, c.message)
        for ex in result.exercises
        for c in ex.checks
    }


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_the_reference_gets_full_marks_however_its_child_starts(mode, monkeypatch):
    monkeypatch.setenv("GRADER_START", mode)
    phases = Phases()
    result = grade_path(SOLUTIONS / "from_scratch.ipynb", QUICK, phases=phases)
    assert result.score == sum(exercise_points(MANIFEST.exercise(e)) for e in QUICK)
    assert all(phases.seconds[name] > 0 for name in phases.NAMES), phases.seconds


def test_a_forked_child_and_a_started_one_give_the_same_verdicts(tmp_path, monkeypatch):
    folder = tmp_path / "mixed" / MANIFEST.assignment
    cells = replacing("allreduce", "def allreduce(data):\n    data[0] = data[0] + data[1]")
    write_notebook(folder / "from_scratch.ipynb", *cells)
    found = {}
    for mode in ("fork", "spawn"):
        monkeypatch.setenv("GRADER_START", mode)
        found[mode] = verdicts(grade_path(folder, QUICK))
    assert found["fork"] == found["spawn"]
    assert not all(passed for passed, _, _ in found["fork"].values())


def test_a_crash_is_reported_with_the_end_of_the_childs_log(tmp_path):
    folder = tmp_path / "crash" / MANIFEST.assignment
    crash = "def try_gpu(i=0):\n    import ctypes\n    ctypes.string_at(0)"
    write_notebook(folder / "from_scratch.ipynb", *replacing("try_gpu", crash))
    result = grade_path(folder, ["try_gpu", "allreduce"])
    by_id = {ex.name: ex for ex in result.exercises}
    said = " ".join(c.message for c in by_id["try_gpu"].checks)
    assert "segmentation fault" in said
    assert "Fatal Python error" in said  # faulthandler's report, from the child's log
    assert by_id["allreduce"].score == exercise_points(MANIFEST.exercise("allreduce"))


def test_notebooks_graded_side_by_side_get_the_verdicts_they_get_one_at_a_time(tmp_path):
    """Each notebook has children (and a scratch folder and log) of its own: a crash in one
    is reported there, with its own log, and costs the other notebook nothing."""
    folder = tmp_path / "two" / MANIFEST.assignment
    crash = "def try_gpu(i=0):\n    import ctypes\n    ctypes.string_at(0)"
    write_notebook(folder / "from_scratch.ipynb", *replacing("try_gpu", crash))
    wrong = "def resnet18(num_classes, in_channels=1):\n    return torch.nn.Flatten()"
    write_notebook(folder / "concise.ipynb", *replacing("resnet18", wrong, "concise.ipynb"))
    exercises = ["try_gpu", "allreduce", "resnet18"]
    found = {n: verdicts(grade_path(folder, exercises, at_once=n)) for n in (1, 2)}
    assert found[1] == found[2]
    crashed = " ".join(m for name, (_, _, m) in found[2].items() if name.startswith("try_gpu"))
    assert "segmentation fault" in crashed and "Fatal Python error" in crashed
    allreduce = [passed for name, (passed, _, _) in found[2].items() if "allreduce" in name]
    assert allreduce, "no allreduce check in the verdicts"
    assert all(allreduce)
    resnet = [m for name, (_, _, m) in found[2].items() if name.startswith("resnet18")]
    assert resnet and not any("segmentation fault" in m or "Fatal" in m for m in resnet)


class IdleCores:
    """Cores that always sit idle: a helper starts as soon as there is an exercise to take."""

    def idle(self, share: float = 0.75) -> bool:
        return True


def test_a_helper_child_takes_cases_from_the_far_end_and_the_verdicts_stay_the_same(
    tmp_path, monkeypatch
):
    """While a child waits (here in time.sleep), idle cores run the notebook's last cases in a
    helper, back from the end; a crash there is restarted there. Every verdict is the one a
    single child gives."""
    import grader.sandbox.fast.spare_cores as spare_cores
    from grader.sandbox.fast.sharing import SharedLoops

    folder = tmp_path / "shared" / MANIFEST.assignment
    waits = (
        "import time\n_waited = []\n\n"
        "def allreduce(data):\n"
        "    if not _waited:\n"
        "        _waited.append(True)\n"
        "        time.sleep(3)\n"
        "    for i in range(1, len(data)):\n"
        "        data[0][:] += data[i].to(data[0].device)\n"
        "    for i in range(1, len(data)):\n"
        "        data[i][:] = data[0].to(data[i].device)"
    )
    crashes = (
        "import os\n\n"
        "def split_batch(X, y, devices):\n"
        "    if X.shape[0] != y.shape[0]:\n"
        "        os._exit(3)\n"
        "    assert X.shape[0] == y.shape[0]\n"
        "    return (d2l.scatter(X, devices), d2l.scatter(y, devices))"
    )
    cells = replacing("split_batch", crashes)
    cells = [waits if "def allreduce(" in c else c for c in cells]
    write_notebook(folder / "from_scratch.ipynb", *cells)
    exercises = ["try_gpu", "allreduce", "split_batch", "train_batch"]
    helpers = []
    make_helper = SharedLoops.helper

    def counting(self):
        made = make_helper(self)
        helpers.append(made is not None)
        return made

    monkeypatch.setattr(SharedLoops, "helper", lambda self: None)
    alone = verdicts(grade_path(folder, exercises, at_once=1))
    monkeypatch.setattr(SharedLoops, "helper", counting)
    monkeypatch.setattr(spare_cores, "spare_cores", IdleCores)
    shared = verdicts(grade_path(folder, exercises, at_once=1))
    assert any(helpers)
    assert shared == alone
    crashed = [m for name, (_, _, m) in shared.items() if name.startswith("split_batch")]
    assert any("exited with code 3" in m for m in crashed)
    kept = [p for name, (p, _, _) in shared.items() if name.startswith(("allreduce", "train"))]
    assert kept, "no allreduce or train_batch check in the verdicts"
    assert all(kept)


def test_shares_give_each_case_to_the_loop_that_takes_it_first():
    """Cases are told apart by exercise too: both exercises here have a `book_demo`."""
    from grader.judge.registry import exercise_checks
    from grader.load.runner import unique_cases
    from grader.sandbox.collected import Collected
    from grader.sandbox.fast.sharing import SharedLoops

    found = {
        e: unique_cases(exercise_checks(MANIFEST.exercise(e), include_hidden=False))
        for e in ("allreduce", "split_batch")
    }
    loops, collected = SharedLoops({"nb": found}, {}), Collected()
    first = loops.first("nb", collected)
    shares = loops.shares["nb"]
    reduce_cases, (*split_but_last, split_last) = shares.cases.values()
    assert loops.helper() is None  # nothing to help with before the first loop starts
    assert first.take("allreduce", reduce_cases[0])
    _nb, helper = loops.helper()  # takes the last case nobody has taken
    assert shares.owner["split_batch", split_last] is helper
    assert not first.take("split_batch", split_last)
    assert helper.take("split_batch", split_but_last[-1])
    left = {"allreduce": reduce_cases, "split_batch": split_but_last[:-1]}
    assert dict(first.left(collected)) == left
    assert shares.untaken(collected) == {**left, "allreduce": reduce_cases[1:]}
    assert helper.holds_any("split_batch", split_but_last) and not helper.holds_any(
        "allreduce", reduce_cases
    )
    collected.outcomes["allreduce"] = {case: CaseOutcome(case) for case in reduce_cases}
    collected.stopped["split_batch"] = "stopped"
    assert first.left(collected) == [] and loops.helper() is None


def test_a_helper_takes_an_exercise_whose_ranks_hold_the_reference_after_the_others():
    """train_ddp's ranks stop at its end: a helper that began with it would fork twice."""
    from grader.judge.registry import exercise_checks
    from grader.load.runner import unique_cases
    from grader.sandbox.collected import Collected
    from grader.sandbox.fast.sharing import SharedLoops
    from grader.sandbox.supervisor import holds_in_ranks

    ids = ("evaluate_accuracy_distributed", "train_ddp", "train_loop")
    cases = {
        e: unique_cases(exercise_checks(MANIFEST.exercise(e), include_hidden=False)) for e in ids
    }
    held = {e for e in ids if holds_in_ranks(MANIFEST.exercise(e), cases[e])}
    assert held == {"train_ddp"}  # train_loop holds names too, but starts no process group
    found = {e: cases[e] for e in ids[:2]}
    loops, collected = SharedLoops({"nb": found}, {"nb": frozenset(held)}), Collected()
    first, shares = loops.first("nb", collected), loops.shares["nb"]
    evaluate, ddp = shares.cases.values()
    assert first.take("evaluate_accuracy_distributed", evaluate[0])
    _nb, helper = loops.helper()
    assert shares.owner["evaluate_accuracy_distributed", evaluate[-1]] is helper
    assert ddp, "train_ddp has no case"
    assert all(("train_ddp", name) not in shares.owner for name in ddp)
    order = helper.left(collected)
    assert order == [("evaluate_accuracy_distributed", evaluate[:0:-1]), ("train_ddp", ddp[::-1])]


def test_the_plain_path_runs_one_loop_per_notebook_whose_children_never_ask():
    """GRADER_FAST=off: no helper loops, and no Claim round trip before each case."""
    from grader.sandbox.collected import Collected
    from grader.sandbox.scheduler import AtOnce
    from grader.sandbox.speedups import PLAIN

    loops, collected = PLAIN.loops({"nb": {"allreduce": []}}, {}), Collected()
    loop = loops.first("nb", collected)
    assert loops.more is None and not loop.asks and not loop.helper
    room = PLAIN.room(AtOnce(2), 4)
    assert room(1) and not room(2)


def test_a_forked_child_cannot_read_the_hidden_checks(tmp_path, monkeypatch):
    hidden = MANIFEST.package_folder(MANIFEST.private_packages[0]) / "try_gpu.py"
    peek = f"def try_gpu(i=0):\n    return open({str(hidden)!r}).read()"
    folder = tmp_path / "peek" / MANIFEST.assignment
    write_notebook(folder / "from_scratch.ipynb", *replacing("try_gpu", peek))
    monkeypatch.setenv("GRADER_START", "fork")
    (ex,) = grade_path(folder, ["try_gpu"]).exercises
    assert ex.score == 0
    assert "private to the grader" in " ".join(c.message for c in ex.checks)


# try_gpu, rewritten to say where a child's temporary files go: the file system under it.
WHERE_TMP = """def try_gpu(i=0):
    import tempfile
    folder = tempfile.gettempdir()
    with tempfile.NamedTemporaryFile(dir=folder):
        pass
    mounts = [line.split() for line in open('/proc/self/mounts')]
    found = [fields[2] for fields in mounts if fields[1] == folder]
    raise RuntimeError(f'temporary files in {folder} on {found[-1] if found else "the disk"}')
"""


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_a_childs_temporary_folder_is_a_memory_file_system_of_its_own(mode, tmp_path, monkeypatch):
    """The ranks of a distributed case write their files there: on a file system in memory,
    seen by the child and its ranks alone, however the child starts."""
    if not choose_fence().namespaces:
        pytest.skip("this machine gives the children no mount namespace")
    folder = tmp_path / "tmp" / MANIFEST.assignment
    write_notebook(folder / "from_scratch.ipynb", *replacing("try_gpu", WHERE_TMP))
    monkeypatch.setenv("GRADER_START", mode)
    (ex,) = grade_path(folder, ["try_gpu"]).exercises
    said = " ".join(c.message for c in ex.checks)
    assert "temporary files in " in said and " on tmpfs" in said, said


def test_huge_pages_leave_forked_children_computing_as_before():
    """The warm server backs what it has imported with huge pages while it waits, a step at a
    time (where the system has them); children forked afterwards compute the same."""
    code = (
        "import os, torch\n"
        "from grader.sandbox.fast.preload import huge_pages\n"
        "x = torch.arange(6.0).reshape(2, 3)\n"
        "step, steps = huge_pages(), 1\n"
        "while not step():\n"
        "    steps += 1\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if torch.equal(x @ x.T, torch.tensor([[5.0, 14.0], [14.0, 50.0]])) else 1)\n"
        "huge = [l for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')]\n"
        "print(steps, huge[0].split()[1], os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))"
    )
    done = subprocess.run([python(), "-c", code], capture_output=True, text=True, check=True)
    steps, huge_kib, child = done.stdout.split()
    assert child == "0"
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[never]" not in thp.read_text():
        assert int(steps) > 1  # a step at a time: a command that comes meanwhile waits little
        assert int(huge_kib) >= 100 << 10  # most of what importing torch leaves in memory


def test_the_fork_server_imports_no_hidden_check_mistake_or_reference():
    code = (
        "import sys\n"
        "from grader.sandbox.fast.preload import preload, the_rest\n"
        "preload()\n"
        "for step in the_rest(): step()\n"
        "print(sorted(m for m in sys.modules if '.private' in m or m.startswith(("
        "'grader.load.reference', 'reference_'))))"
    )
    done = subprocess.run([python(), "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def ask_for_child(ours: socket.socket, tmp_path: Path, complete: bool) -> int:
    """Ask a session for a child (of a request that does not exist: it ends at once), as the
    grader does; return the descriptor its process id, then its exit code, come on."""
    order = ForkOrder(
        request=str(tmp_path / "none.pt"), scratch=str(tmp_path), env={}, uid=None,
        fence=asdict(Fence("", False, "")), private=[], tmp="", memory_gib=4.0, complete=complete,
    )  # fmt: skip
    message = json.dumps(to_plain(order)).encode()
    status_read, status_write = os.pipe()
    with open(os.devnull, "wb") as null:
        socket.send_fds(ours, [message], [null.fileno()] * 3 + [status_write])
    os.close(status_write)
    return status_read


def start_session(ours: socket.socket, theirs: socket.socket, rest: Callable[[], None]) -> int:
    """Fork a session serving on `theirs` that has `rest` still to import; return its pid."""
    pid = os.fork()
    if pid == 0:
        ours.close()
        try:
            forkserver.serve(theirs, Fence("", False, ""), fenced=False, rest=[rest])
        finally:
            os._exit(0)
    theirs.close()
    return pid


def test_a_session_forks_a_plain_child_before_importing_what_a_complete_one_waits_for(tmp_path):
    """A session forked before the server had imported everything: of two requests asked for
    at once, it forks the one that needs no more first, imports the rest, then forks the
    `complete` one (whose cases start process groups) with it imported."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    seen = tmp_path / "children when the rest was imported"

    def rest() -> None:  # in the session: how many children it had forked by then
        mine = [p for p in Path("/proc").iterdir() if p.name.isdigit() and p.name != "self"]
        parents = [
            (p / "stat").read_text().rpartition(")")[2].split()[1]
            for p in mine
            if (p / "stat").exists()
        ]
        seen.write_text(str(parents.count(str(os.getpid()))))

    # both in the socket before the session reads either
    statuses = [ask_for_child(ours, tmp_path, complete) for complete in (True, False)]
    pid = start_session(ours, theirs, rest)
    assert json.loads(ours.recv(1 << 16))["ready"]
    pids = [int.from_bytes(os.read(fd, 4), "big", signed=True) for fd in statuses]
    assert all(p > 0 for p in pids)  # both were forked
    assert seen.read_text() == "1"  # the plain one, before the rest was imported
    ours.close()
    os.waitpid(pid, 0)
    for fd in statuses:
        os.close(fd)


def test_a_session_waits_for_a_grader_that_asks_a_moment_after_it_is_ready(tmp_path, monkeypatch):
    """A grader prepares its requests for a moment after the session says it is ready: the
    session does not start importing the rest unasked meanwhile (a request that came then
    waited for the whole step), so the plain child asked for is forked at once."""
    monkeypatch.setattr(forkserver, "QUIET_SECONDS", 5.0)  # the moment is far shorter
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    seen = tmp_path / "when the rest was imported"

    def rest() -> None:
        seen.write_text("imported")

    pid = start_session(ours, theirs, rest)
    assert json.loads(ours.recv(1 << 16))["ready"]
    time.sleep(0.1)  # the grader prepares its request
    status_read = ask_for_child(ours, tmp_path, complete=False)
    child = int.from_bytes(os.read(status_read, 4), "big", signed=True)
    ours.close()
    os.waitpid(pid, 0)
    os.close(status_read)
    assert child > 0
    assert not seen.exists()  # nothing imported unasked before the request came


@pytest.mark.parametrize(
    "message",
    [b"{not json", b'{"kind": "fork", "request": "x"}', b'{"kind": "exec", "argv": ["sh"]}'],
)
def test_a_session_refuses_an_order_it_cannot_read_and_serves_the_next(tmp_path, message):
    """An order that is not JSON, lacks a field or is of another kind forks nothing (its
    descriptors are closed, so whoever sent it reads no pid), and the session goes on."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = start_session(ours, theirs, lambda: None)
    assert json.loads(ours.recv(1 << 16))["ready"]
    refused_read, refused_write = os.pipe()
    with open(os.devnull, "wb") as null:
        socket.send_fds(ours, [message], [null.fileno()] * 3 + [refused_write])
    os.close(refused_write)
    status_read = ask_for_child(ours, tmp_path, complete=False)
    child = int.from_bytes(os.read(status_read, 4), "big", signed=True)
    refused = os.read(refused_read, 4)
    ours.close()
    os.waitpid(pid, 0)
    for fd in (status_read, refused_read):
        os.close(fd)
    assert refused == b""
    assert child > 0
