"""The distributed notebook's runtime: `d2l.launch`, notebooks that launch, torchrun, the bench.

The launcher runs real process groups on gloo over this machine's loopback; the torchrun test
trains LeNet with the reference `train_ddp` in two processes and replays the run in one.
"""

import contextlib
import functools
import io
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import dplab.distributed
import dplab.rank
import dplab.rank_watch
import grader.ranks.rankpool
from dplab.devices import num_gpus
from dplab.distributed import RankFailed, RanksHung, RanksTimedOut, launch
from dplab.rank_watch import ANSWER_SECONDS, QUIET_SECONDS, Group, quiet, where_from
from grader.exercises.train_ddp.checks import plain_state, replay_on, training_steps
from grader.load.notebook import load_notebook, read_cells
from grader.manifest import REPO
from grader.ranks.launching import GroupStopped, launch_each
from grader.ranks.rankpool import RankPool
from tests.conftest import SOLUTIONS, python, write_notebook

# ---- the launcher --------------------------------------------------------------------------


def book_demo():
    t = torch.ones((1, 2)) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} holds {t.tolist()}")
    return t


def test_every_rank_sums_and_each_ones_output_comes_back():
    done = launch(book_demo, nprocs=2, show=False)
    assert [t.tolist() for t in done.results] == [[[3.0, 3.0]], [[3.0, 3.0]]]
    assert torch.equal(done.result, torch.tensor([[3.0, 3.0]]))
    assert done.outputs == ["rank 0 holds [[3.0, 3.0]]\n", "rank 1 holds [[3.0, 3.0]]\n"]
    assert done.backend == "gloo"


def test_output_is_shown_as_it_comes_behind_the_rank(capsys):
    launch(book_demo, nprocs=3)
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == [f"[rank {r}] rank {r} holds [[6.0, 6.0]]" for r in range(3)]


def environment():
    return {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}


def test_each_rank_finds_torchruns_variables_and_no_port_is_taken():
    results = launch(environment, nprocs=3, show=False).results
    assert [r["RANK"] for r in results] == ["0", "1", "2"]
    assert [r["LOCAL_RANK"] for r in results] == ["0", "1", "2"]
    assert {r["WORLD_SIZE"] for r in results} == {"3"}
    assert {r["MASTER_PORT"] for r in results} == {None}  # they meet through a file


def raises_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("rank one cannot go on")
    dist.barrier()


def test_a_rank_that_raises_stops_the_group_and_is_named():
    with pytest.raises(RankFailed) as caught:
        launch(raises_on_rank_one, nprocs=3, show=False)
    assert caught.value.rank == 1
    assert str(caught.value).startswith("rank 1 raised ValueError: rank one cannot go on")


def fails_in_two():
    """A group of 2 fails at once; one of 3 returns after a moment; one of 4 sleeps on."""
    world = dist.get_world_size()
    if world == 2:
        raise ValueError("two is too few")
    time.sleep(1.0 if world == 3 else 600)
    return world


@pytest.mark.parametrize("where", ["launch_each", "a pool"])
def test_once_a_group_fails_the_groups_after_it_stop_and_those_before_it_run_on(where):
    calls = [(fails_in_two, 3), (fails_in_two, 2), (fails_in_two, 4)]
    # Without the stop, the group of 4 would be called stuck after idle_timeout instead.
    limits = dict(backend="gloo", idle_timeout=8, stop_after_failure=True)
    if where == "a pool":
        with RankPool() as pool:
            done = pool.run_each(calls, **limits)
            after = pool.run_each([(who_and_how_many, 4)], backend="gloo")[0]
            assert pool.forks == 3 + 2 + 4 + 4 + sum(pool.formed_again)  # the 4 forked anew
        assert [r[1:] for r in after.results] == [(r, 4) for r in range(4)]
    else:
        done = launch_each(calls, **limits)
    assert done[0].results == [3, 3, 3]
    assert isinstance(done[1], RankFailed) and "two is too few" in str(done[1])
    assert isinstance(done[2], GroupStopped)
    assert "the group of 4 processes was stopped: the group of 2 before it had failed" in str(
        done[2]
    )


def sends_first():
    t = torch.ones(4)
    peer = 1 - dist.get_rank()
    dist.send(t, peer)
    dist.recv(t, peer)


def says_quiet(message: str, rank: int) -> bool:
    """Return True if the verdict says that `rank` computed nothing (for however long: how
    soon a deadlock is called depends on how busy the machine is, and is not tested)."""
    return bool(
        re.search(rf"rank {rank} computed nothing for [0-9.]+ s and had not finished", message)
    )


def test_a_deadlock_is_stopped_and_says_where_each_rank_waits():
    with pytest.raises(RanksHung) as caught:
        launch(sends_first, nprocs=2, idle_timeout=3, show=False)
    message = str(caught.value)
    assert "a deadlock" in message
    for rank in (0, 1):
        assert says_quiet(message, rank), message
    assert message.count("waiting in torch.distributed's send, called from") == 2
    assert "in sends_first" in message


def both_receive():
    dist.recv(torch.ones(2), 1 - dist.get_rank())


@pytest.fixture
def watch_steps(monkeypatch) -> list[tuple]:
    """Record, in order, the parent's steps towards a quick deadlock verdict: each reading of
    whether the ranks stayed quiet (`quiet`), the waiting ranks asked to run Python, whether
    one answered, and their stacks taken for a verdict."""
    steps: list[tuple] = []
    group = Group

    def recorded(name: str, fn, shown=lambda said, args: said):
        def step(*args):
            said = fn(*args)
            steps.append((name, shown(said, args)))
            return said

        return step

    monkeypatch.setattr(dplab.rank_watch, "quiet", recorded("quiet", quiet))
    asked = recorded("asked", group.ask_awake, lambda said, args: list(args[1]))
    monkeypatch.setattr(group, "ask_awake", asked)
    monkeypatch.setattr(group, "answered", recorded("answered", group.answered))
    monkeypatch.setattr(group, "where", recorded("stacks", group.where, lambda said, args: None))
    return steps


def test_ranks_asleep_in_torch_distributed_are_called_deadlocked_before_the_idle_limit(
    watch_steps,
):
    """Ranks whose threads all sleep, computing nothing, and that run no Python when asked
    (a rank in time.sleep would) wait for each other inside torch.distributed: the verdict
    comes once they have been quiet for a moment and have not answered, not after the whole
    idle limit (on a machine busy enough to keep a thread runnable for long, the idle limit
    decides: it is long here, so that such a machine still finds a quiet moment before it)."""
    with pytest.raises(RanksHung) as caught:
        launch(both_receive, nprocs=2, idle_timeout=120, show=False)
    message = str(caught.value)
    assert "waiting in torch.distributed's recv" in message
    # Quiet, asked, no answer, still quiet: the quick verdict (the idle limit's comes
    # without the last three steps in a row).
    assert watch_steps[-5:] == [
        ("quiet", True),
        ("asked", [0, 1]),
        ("answered", False),
        ("quiet", True),
        ("stacks", None),
    ], watch_steps


def sleeps_then_sends():
    t = torch.ones(3)
    if dist.get_rank() == 0:
        time.sleep(2.5)  # longer than a quiet deadlocked group gets: QUIET_SECONDS
        dist.send(t * 2, 1)
    else:
        dist.recv(t, 0)
    return t.tolist()


def test_a_rank_sleeping_in_python_while_the_others_wait_for_it_is_not_a_deadlock():
    assert QUIET_SECONDS + ANSWER_SECONDS < 2.5
    done = launch(sleeps_then_sends, nprocs=2, idle_timeout=5, show=False)
    assert done.results == [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]


def stops_then_sends(folder: Path):
    t = torch.ones(3)
    if dist.get_rank() == 0:
        (folder / "rank0.pid").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)  # held up outside torch: the test resumes it
        dist.send(t * 2, 1)
    else:
        dist.recv(t, 0)
    return t.tolist()


def test_a_rank_held_up_outside_torch_while_the_others_wait_for_it_is_not_a_deadlock(tmp_path):
    """A stopped rank runs no Python and uses no processor, like a deadlocked one; it is held
    up all the same (as one in a disk wait is), and the others wait for it, not for nothing."""

    def resume_later():
        pid_file = tmp_path / "rank0.pid"
        while not pid_file.exists():
            time.sleep(0.01)
        time.sleep(QUIET_SECONDS + ANSWER_SECONDS + 1.5)
        os.kill(int(pid_file.read_text()), signal.SIGCONT)

    resumer = threading.Thread(target=resume_later)
    resumer.start()
    try:
        done = launch(functools.partial(stops_then_sends, tmp_path), nprocs=2, idle_timeout=30)
    finally:
        resumer.join()
    assert done.results == [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]


# Processes that do not exist (above any pid_max): their threads' /proc files are faked.
STARVED, SLEEPER = 2**30 + 1, 2**30 + 2


def test_a_thread_kept_waiting_for_a_processor_counts_as_wanting_to_run(monkeypatch):
    """What the quick deadlock verdict reads, here from /proc files written as the kernel
    writes them and on a clock of the test's own: a thread starved of processor time by
    another (a busy machine) computes next to nothing, yet wants to run all the time; one
    that sleeps wants nothing."""
    proc: dict[str, bytes] = {}  # /proc/<pid>/task/<pid>/{schedstat,stat} of the two
    tasks = {f"/proc/{pid}/task": [str(pid)] for pid in (STARVED, SLEEPER)}

    def thread(pid: int, on_cpu_ns: int, waited_ns: int, runs: int, state: str) -> None:
        """Fake the one thread of `pid`: its schedstat, and its state in its stat."""
        folder = f"/proc/{pid}/task/{pid}"
        proc[f"{folder}/schedstat"] = f"{on_cpu_ns} {waited_ns} {runs}\n".encode()
        proc[f"{folder}/stat"] = f"{pid} (python) {state} 1 {pid} {pid} 0 -1".encode()

    listdir, clock = os.listdir, [100.0]
    monkeypatch.setattr(os, "listdir", lambda path=".": tasks.get(path) or listdir(path))
    monkeypatch.setattr(
        dplab.rank_watch,
        "open",
        lambda path, *a, **k: io.BytesIO(proc[path]) if path in proc else open(path, *a, **k),
        raising=False,
    )
    monkeypatch.setattr(dplab.rank_watch, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    groups = {pid: Group(Path("."), [pid], False) for pid in (STARVED, SLEEPER)}
    thread(STARVED, 3_000_000, 500_000_000, 7, "R")
    thread(SLEEPER, 40_000_000, 1_000_000, 12, "S")
    last = {pid: g.demand() for pid, g in groups.items()}

    def wanted_after(seconds: float) -> dict[int, float]:
        """Move the clock on; return how long each thread ran or waited to run meanwhile."""
        clock[0] += seconds
        now = {pid: g.demand() for pid, g in groups.items()}
        said = {pid: now[pid] - last[pid] for pid in groups}
        last.update(now)
        return said

    # The starved thread ran once, for 2 ms, after waiting 0.9 s (the kernel adds a wait when
    # the thread gets a processor); the sleeper did not wake.
    thread(STARVED, 5_000_000, 1_400_000_000, 8, "R")
    assert wanted_after(1.0) == pytest.approx({STARVED: 0.902, SLEEPER: 0.0})
    # Then it did not run at all, waiting all along (the kernel has not added that wait yet).
    assert wanted_after(1.0) == pytest.approx({STARVED: 1.0, SLEEPER: 0.0})


def cpu_quota(share: float) -> Path | None:
    """Make a control group whose processes share `share` of one core between them (the CPU
    quota of a container, as on Gradescope); return the file that a process writes its pid
    to, to join it. None where this machine lets no one make one (not root, say)."""
    period = 100_000
    quota = max(1000, int(share * period))  # the kernel's least quota is 1 ms per period
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        group, limit, value = v2 / f"dplab-quota-{os.getpid()}", "cpu.max", f"{quota} {period}"
    else:
        group, limit = v2 / "cpu" / f"dplab-quota-{os.getpid()}", "cpu.cfs_quota_us"
        value = str(quota)
    try:
        group.mkdir(exist_ok=True)
        (group / limit).write_text(value)
    except OSError:
        return None
    return group / "cgroup.procs"


def computes_in_a_quota(procs: Path, seconds: float):
    """Join the quota's group and use `seconds` of processor time there; then leave it (for
    gloo's and the launcher's own steps) and sum the ranks."""
    procs.write_text(str(os.getpid()))
    began = time.process_time()
    while time.process_time() - began < seconds:
        sum(range(10_000))
    (procs.parent.parent / "cgroup.procs").write_text(str(os.getpid()))
    t = torch.ones(2)
    dist.all_reduce(t)
    return t.tolist()


def test_ranks_starved_by_a_cpu_quota_are_slow_not_deadlocked():
    """Ranks in a container whose CPU quota is shared by many processes (Gradescope's half
    core, say) compute for a moment now and then, far less than an idle limit allows, yet
    want a processor all the time: they are slow, and finish. Here two ranks share 2% of a
    core for 0.05 s of work each, some 5 s, with an idle limit of 2 s."""
    procs = cpu_quota(0.02)
    if procs is None:
        pytest.skip("making a CPU quota's control group needs root (or a delegated cgroup)")
    try:
        work = functools.partial(computes_in_a_quota, procs, 0.05)
        done = launch(work, nprocs=2, idle_timeout=2, show=False)
    finally:
        with contextlib.suppress(OSError):
            procs.parent.rmdir()
    assert done.results == [[2.0, 2.0], [2.0, 2.0]]


def test_a_rank_computing_in_a_notebook_named_distributed_is_not_said_to_wait_in_torch():
    """Where a stuck rank is: in torch.distributed's call only when the innermost frame is
    torch.distributed's own, not when the student's notebook is distributed.ipynb."""
    torch_file = os.path.join("site-packages", "torch", "distributed", "distributed_c10d.py")
    waiting = (
        f'  File "{torch_file}", line 2501 in all_reduce\n'
        '  File "<distributed.ipynb, cell `train_ddp-solution`>", line 29 in train_ddp\n'
    )
    computing = '  File "<distributed.ipynb, cell `train_ddp-solution`>", line 26 in train_ddp\n'
    assert where_from(waiting).startswith("waiting in torch.distributed's all_reduce, called from")
    assert where_from(computing) == (
        'File "<distributed.ipynb, cell `train_ddp-solution`>", line 26 in train_ddp'
    )


def skips_the_all_reduce():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(2))


def test_a_rank_that_skips_a_collective_is_named():
    with pytest.raises(RanksHung) as caught:
        launch(skips_the_all_reduce, nprocs=2, idle_timeout=3, show=False)
    assert caught.value.finished == [1]
    assert "a rank skipped a call that the others made" in str(caught.value)
    assert "waiting in torch.distributed's all_reduce" in str(caught.value)


def dies_on_rank_two():
    if dist.get_rank() == 2:
        print("leaving now")
        os._exit(3)
    dist.barrier()


def test_a_rank_that_dies_is_named_with_its_last_words():
    with pytest.raises(RankFailed) as caught:
        launch(dies_on_rank_two, nprocs=3, show=False)
    assert caught.value.rank == 2
    assert "rank 2's process exited with code 3" in str(caught.value)
    assert "leaving now" in str(caught.value)


def spins():
    while True:
        pass


def test_ranks_that_compute_without_end_hit_the_processor_time_limit():
    with pytest.raises(RanksTimedOut, match="more than 2 s of processor time"):
        launch(spins, nprocs=2, cpu_limit=2, show=False)


# ---- ranks that stay (RankPool) -----------------------------------------------------------


def who_and_how_many():
    """Return this rank's process, its rank, and the size of the group it is in now."""
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} of {int(t)}")
    return os.getpid(), dist.get_rank(), int(t)


def leaves_its_group():
    dist.destroy_process_group()  # the student's code may end the group; the next run has one
    return os.getpid()


def test_a_pool_forks_each_size_once_and_gives_every_run_a_group_of_its_own():
    with RankPool() as pool:
        first = pool.run_each([(who_and_how_many, 2), (who_and_how_many, 3)], backend="gloo")
        ended = pool.run_each([(leaves_its_group, 2)], backend="gloo")
        again = pool.run_each([(who_and_how_many, 2), (who_and_how_many, 3)], backend="gloo")
        assert pool.forks == 5 + sum(pool.formed_again)  # (see the test below)
    for done, size in zip(first + again, (2, 3, 2, 3), strict=True):
        assert [r[1:] for r in done.results] == [(rank, size) for rank in range(size)]
        assert done.outputs == [f"rank {r} of {size}\n" for r in range(size)]  # this run's
    if not pool.formed_again:  # a group that could not form ran again, on ranks forked anew
        assert [r[0] for r in again[0].results] == [r[0] for r in first[0].results]
        assert ended[0].results == [r[0] for r in first[0].results]


def fails_to_form(fn, args, kwargs, rank, world, backend, folder, init_timeout):
    """What a rank meets when gloo cannot connect it to its peers (a busy machine has made it
    happen to reused ranks, about once in thirty runs): the function never runs."""
    import dplab.distributed

    if not (folder.parent / "failed-once").exists():
        (folder.parent / "failed-once").touch()
        dplab.rank.leave_error(folder, rank, dplab.distributed.GroupNotFormed("closed"))
        return 1
    return ORIGINAL_ONE_RUN(fn, args, kwargs, rank, world, backend, folder, init_timeout)


ORIGINAL_ONE_RUN = dplab.rank.one_run


def test_a_run_whose_group_could_not_form_runs_again_on_new_ranks(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the runs' folders go
    monkeypatch.setattr(grader.ranks.rankpool, "one_run", fails_to_form)  # (the ranks fork it)
    with RankPool() as pool:
        done = pool.run_each([(who_and_how_many, 2)], backend="gloo")[0]
        assert pool.formed_again == [2]
        assert pool.forks == 2 + 2
    assert [r[1:] for r in done.results] == [(0, 2), (1, 2)]


def test_after_a_run_that_fails_or_hangs_a_pool_forks_new_ranks():
    with RankPool() as pool:
        before = pool.run_each([(who_and_how_many, 3)], backend="gloo")[0]
        failed = pool.run_each([(raises_on_rank_one, 3)], backend="gloo")[0]
        assert isinstance(failed, RankFailed) and failed.rank == 1
        assert str(failed).startswith("rank 1 raised ValueError: rank one cannot go on")
        hung = pool.run_each([(sends_first, 2)], backend="gloo", idle_timeout=3)[0]
        assert isinstance(hung, RanksHung) and "waiting in torch.distributed's send" in str(hung)
        after = pool.run_each([(who_and_how_many, 3), (who_and_how_many, 2)], backend="gloo")
        assert pool.forks == 3 + 2 + 3 + 2 + sum(pool.formed_again)
    assert [r[1:] for r in after[0].results] == [(r, 3) for r in range(3)]
    assert {r[0] for r in after[0].results}.isdisjoint(r[0] for r in before.results)


def test_ranks_forked_under_another_key_are_not_used_again():
    with RankPool() as pool:
        one = pool.run_each([(who_and_how_many, 2)], key="a", backend="gloo")[0]
        same = pool.run_each([(who_and_how_many, 2)], key="a", backend="gloo")[0]
        other = pool.run_each([(who_and_how_many, 2)], key="b", backend="gloo")[0]
    assert [r[0] for r in same.results] == [r[0] for r in one.results]
    assert {r[0] for r in other.results}.isdisjoint(r[0] for r in one.results)


MARKS: list[str] = []  # what a run left behind in a rank


def leaves_a_mark():
    MARKS.append("here")
    return len(MARKS)


def mark_test(raising: bool):
    def before_fork():
        def forked():
            def test() -> bool:
                if MARKS and raising:
                    raise RuntimeError("a run changed MARKS")
                return not MARKS

            return test

        return forked

    return before_fork


def test_a_rank_that_a_run_changed_serves_no_more_and_may_fail_the_run():
    with RankPool(still_clean=mark_test(raising=False)) as pool:
        kept = [pool.run_each([(leaves_a_mark, 2)], backend="gloo")[0] for _ in range(2)]
        assert pool.forks == 4  # the first ranks stood down after their run
    assert [done.results for done in kept] == [[1, 1], [1, 1]]
    with RankPool(still_clean=mark_test(raising=True)) as pool:
        failed = pool.run_each([(leaves_a_mark, 2)], backend="gloo")[0]
    assert isinstance(failed, RankFailed) and "a run changed MARKS" in str(failed)


def stalls_after_each_run():
    def forked():
        def test() -> bool:
            time.sleep(60)  # the launcher's own step after a run, stalled (a very busy machine)
            return True

        return test

    return forked


def test_a_group_whose_every_rank_returned_gives_its_results_though_it_then_stalls():
    with RankPool(still_clean=stalls_after_each_run) as pool:
        stalled = pool.run_each([(who_and_how_many, 2)], backend="gloo", idle_timeout=2)[0]
        after = pool.run_each([(who_and_how_many, 2)], backend="gloo", idle_timeout=2)[0]
        assert pool.forks == 4  # the stalled ranks were stopped, and new ones forked
    assert [r[1:] for r in stalled.results] == [(0, 2), (1, 2)]
    assert {r[0] for r in after.results}.isdisjoint(r[0] for r in stalled.results)


# In a Python that has imported what the grading children of the distributed notebook have,
# pyplot imported as a notebook loaded by the grader imports it (to run its code when first
# used), then ranks launched; each says whether pyplot had run its code.
RANKS_AND_PYPLOT = """
import sys
from grader.sandbox.fast.preload import preload, the_rest
from grader.load.notebook import imported_when_used
import dplab.distributed
import dplab.rank
import dplab.rank_watch
import grader.ranks.rankpool
preload()
for step in the_rest():
    step()

def pyplot_ran():
    return 'matplotlib.figure' in sys.modules

with imported_when_used():
    import matplotlib.pyplot
print(dplab.distributed.launch(pyplot_ran, nprocs=2, backend='gloo', show=False).results)
"""


def test_ranks_leave_a_pyplot_that_nothing_has_used_unloaded():
    """Each run switches a loaded pyplot to files only; one that nothing has used stays as it
    is: switching it would make every rank run its code (0.2 s each)."""
    done = subprocess.run(
        [python(), "-c", RANKS_AND_PYPLOT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[False, False]"


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="nprocs must be a whole number from 1 to 16"):
        launch(book_demo, nprocs=0)
    with pytest.raises(TypeError, match="args must be a tuple"):
        launch(book_demo, args=3)
    with pytest.raises(ValueError, match='backend must be "gloo", "nccl" or "auto"'):
        launch(book_demo, backend="mpi")


# ---- notebooks that launch -----------------------------------------------------------------


def test_loading_a_notebook_runs_no_launch_however_deep(tmp_path):
    marker = tmp_path / "ran"
    notebook = write_notebook(
        tmp_path / "launching.ipynb",
        "import dplab as d2l",
        f"def touch():\n    open({str(marker)!r}, 'w').write('ran')",
        "def demo():\n    return d2l.launch(touch, nprocs=2)",
        "result = demo()",
        "d2l.launch(touch, nprocs=2)",
        "defined = True",
    )
    loaded = load_notebook(notebook)
    assert not marker.exists()
    assert loaded.namespace["defined"] is True
    assert "result" not in loaded.namespace  # its statement ended at the launch
    assert loaded.notes == []


# ---- torchrun -------------------------------------------------------------------------------

PLAIN_LENET = """
def lenet_without_batch_norm():
    return nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
"""


@pytest.mark.slow
def test_torchrun_trains_two_ranks_in_step_with_one_process(tmp_path):
    """`torchrun --nproc-per-node 2 -m dplab.train_ddp` on the reference train_ddp: both ranks
    end with the same weights, and those of one process trained by SGD on the same global
    batches. (The model has no batch norm, whose per-rank statistics one process would not
    reproduce.)"""
    notebook = write_notebook(
        tmp_path / "distributed.ipynb", *read_cells(SOLUTIONS / "distributed.ipynb"), PLAIN_LENET
    )
    record = tmp_path / "record"
    torchrun = Path(python()).with_name("torchrun")
    proc = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "tests.ddp_recorded",  # dplab.train_ddp, each rank's run noted
            "--notebook",
            str(notebook),
            "--model",
            "lenet_without_batch_norm",
            "--data",
            "sample",
            "--subset",
            "512",
            "128",
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--lr",
            "0.3",
            "--record",
            str(record),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "test acc: " in proc.stdout and "on 2 processes (gloo, cpu)" in proc.stdout
    ranks = [torch.load(record / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert len(training_steps(ranks[0]["log"])) == 2 * 512 // 64
    zero, one = plain_state(ranks[0]["final"]), plain_state(ranks[1]["final"])
    for name in zero:
        assert torch.equal(zero[name], one[name]), name
    assert ranks[0]["history"] == ranks[1]["history"]

    namespace = load_notebook(notebook).namespace
    import dplab

    train_set, _ = dplab.fashion_mnist_datasets(source="sample", subset=(512, 128))
    single = replay_on(ranks, namespace["lenet_without_batch_norm"](), *train_set.tensors, 0.3)
    for name, value in single.state_dict().items():
        assert torch.allclose(zero[name], value, rtol=1e-4, atol=1e-5), name


def test_train_ddp_outside_torchrun_says_how_to_start_it():
    proc = subprocess.run(
        [python(), "-m", "dplab.train_ddp"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "torchrun --nproc-per-node 2 -m dplab.train_ddp" in proc.stderr


@pytest.mark.skipif(num_gpus() > 0, reason="NCCL is refused only where there is no GPU")
def test_train_ddp_asked_for_nccl_without_a_gpu_says_so(tmp_path):
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    notebook = REPO / "solutions" / "multigpu" / "distributed.ipynb"
    proc = subprocess.run(
        [python(), "-m", "dplab.train_ddp", "--notebook", str(notebook), "--backend", "nccl"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "--backend nccl needs a CUDA GPU, and none is here" in proc.stderr


# ---- the bench ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_bench_prints_a_table_per_group_and_a_plot(tmp_path):
    plot = tmp_path / "bench.png"
    proc = subprocess.run(
        [
            python(), "-m", "grader.benchmarks.bandwidth", "--procs", "2", "--sizes", "4096",
            "16777216", "--repeats", "1", "--plot", str(plot),
        ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "| size | all_reduce | ring | per-parameter | bucketed |" in proc.stdout
    assert "| 4 KiB |" in proc.stdout and "| 16 MiB |" in proc.stdout
    assert "at 16 MiB the ring reaches" in proc.stdout
    assert plot.stat().st_size > 0


@pytest.mark.slow
def test_in_a_notebook_a_failed_launch_is_one_short_error(tmp_path):
    """In JupyterLab, d2l.launch's error names the rank, the call and the student's cell and
    line, in a few lines: no frames of the launcher, no traceback through dplab (issue 31)."""
    import nbformat
    from nbclient import NotebookClient

    cells = [
        "import torch, torch.distributed as dist\nimport dplab as d2l",
        "def skips(tensor):\n"
        "    if dist.get_rank() == 0:\n"
        "        dist.send(tensor, dst=1)\n"
        "        dist.send(tensor, dst=1)\n"
        "    else:\n"
        "        dist.recv(tensor, src=0)\n",
        "d2l.launch(skips, (torch.ones(3),), nprocs=2, idle_timeout=5)",
        "def boom(x):\n    return x / not_defined",
        "d2l.launch(boom, (1,), nprocs=2)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True).execute(
        cwd=str(tmp_path)
    )
    errors = {
        i: re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(o["traceback"]))
        for i, cell in enumerate(nb.cells)
        for o in cell.get("outputs", [])
        if o["output_type"] == "error"
    }
    assert set(errors) == {2, 4}, errors
    hung, failed = errors[2], errors[4]
    assert hung.startswith("RanksHung: "), hung
    assert "rank 0" in hung and "send, called from Cell In[2], line 4 in skips" in hung, hung
    assert failed.splitlines()[:3] == [
        "RankFailed: rank 0 raised NameError: name 'not_defined' is not defined",
        "  Cell In[4], line 2, in boom",
        "    return x / not_defined",
    ] or failed.startswith("RankFailed: rank 1 raised NameError"), failed
    for text in (hung, failed):
        assert "dplab" not in text and len(text.splitlines()) <= 5, text
