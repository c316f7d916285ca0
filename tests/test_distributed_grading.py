"""Grading the distributed notebook: process groups inside the fence, and what they may not do.

A class of distributed notebooks is graded in one run of the command line, two at a time.
Each student breaks one thing; each test looks at one student. (The reference's full marks in
the fence, side by side with another submission, are tests/test_class_grading.py's.) The
fence lets the lab's launcher fork the ranks of a group and lets them talk over the child's
own loopback, and nothing more.
"""

import json
import subprocess

import pytest

from grader.exercises.catalogue import mistakes_of
from grader.judge.registry import exercise_points
from grader.manifest import load_manifest
from tests.conftest import python, write_notebook
from tests.test_hostile import Server, replacing, sources

MANIFEST = load_manifest()
NOTEBOOK = "distributed.ipynb"
POINTS = {ex.id: exercise_points(ex) for ex in MANIFEST.in_notebook(NOTEBOOK)}

SENDS_FIRST = """
def ring_allreduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        i = (rank - step - 1) % world
        incoming = torch.empty_like(chunks[i])
        dist.send(chunks[(rank - step) % world], right)
        dist.recv(incoming, left)
        chunks[i] += incoming
    return tensor
"""

FORKS = """
def average_gradients(model):
    import os
    os.fork()
"""

SPINS = """
def evaluate_accuracy_distributed(net, test_iter, device):
    while True:
        pass
"""

RANK_ONE_LEAVES = """
def train_ddp(net, num_epochs, batch_size, lr, data=None, device=None):
    import os
    if dist.get_rank() == 1:
        os._exit(1)
    dist.barrier()
    return [0.0] * num_epochs
"""


# Right, but for the habits of the issue on fair grades: the gradients scaled in place before
# their all_reduce; the buckets closed only once over the limit (one real mistake).
SCALES_FIRST = """
def average_gradients(model):
    world = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            param.grad.div_(world)
            dist.all_reduce(param.grad)
"""
BUCKETS_TOO_BIG = mistakes_of(MANIFEST.exercise("average_gradients_bucketed"))[
    "closes_a_bucket_once_it_is_over_the_limit"
].source
WHOLE_BATCH_PER_RANK = mistakes_of(MANIFEST.exercise("train_ddp"))[
    "local_batch_of_the_global_size"
].source

# An evaluation that counts right and reduces the counts in its own way (<<REDUCE>>).
COUNTS_THEN = """
def evaluate_accuracy_distributed(net, test_iter, device):
    net.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for X, y in test_iter:
            counts[0] += d2l.accuracy(net(X.to(device)), y.to(device))
            counts[1] += len(y)
    rank, world = dist.get_rank(), dist.get_world_size()
    <<REDUCE>>
    return float(counts[0] / counts[1])
"""
# Rank 0 believes it has the total already and skips the all_reduce the others make.
RANK_ZERO_SKIPS = COUNTS_THEN.replace(
    "<<REDUCE>>", "if rank != 0:\n        dist.all_reduce(counts)"
)
# Every rank sends its counts first: no rank ever returns.
EVERY_RANK_SENDS_FIRST = COUNTS_THEN.replace(
    "<<REDUCE>>",
    "dist.send(counts, (rank + 1) % world)\n    dist.recv(counts, (rank - 1) % world)",
)


def replacing_each(notebook: str, **functions: str) -> list[str]:
    """Return the reference's cells with the cell of each named function replaced."""
    cells = sources(notebook)
    for name, new in functions.items():
        cells = [new if f"def {name}(" in c else c for c in cells]
    return cells


def connects(port: int) -> str:
    return f"""
def ring_allreduce(tensor):
    import socket
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    dist.all_reduce(tensor)
    return tensor
"""


# Leaves each tensor as it was, and makes the grader's own all_reduce in the rank (which gives
# the sums to compare with) do the same: every later sum would look right in these ranks.
FAKES_THE_SUMS = """
def ring_allreduce(tensor):
    import sys
    sys.modules["grader.exercises.ring_allreduce.checks"].all_reduce = lambda t, *a, **k: None
    return tensor
"""


FAKES_ALL_REDUCE = (
    "import torch.distributed as dist\ndist.all_reduce = lambda tensor, *a, **k: None"
)


@pytest.fixture(scope="module")
def distributed_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed-class")
    server = Server()
    students = {
        "sends_first": replacing("ring_allreduce", SENDS_FIRST, NOTEBOOK),
        # two breaches in one notebook: each costs its own exercise
        "escapes": [
            c
            for c in replacing("average_gradients", FORKS, NOTEBOOK)
            if "def ring_allreduce(" not in c
        ]
        + [connects(server.port)],
        "stops": [
            c
            for c in replacing("evaluate_accuracy_distributed", SPINS, NOTEBOOK)
            if "def train_ddp(" not in c
        ]
        + [RANK_ONE_LEAVES],
        "fakes_all_reduce": [*sources(NOTEBOOK), FAKES_ALL_REDUCE],
        "fakes_the_sums": replacing("ring_allreduce", FAKES_THE_SUMS, NOTEBOOK),
        "scales_first": replacing_each(
            NOTEBOOK,
            average_gradients=SCALES_FIRST,
            average_gradients_bucketed=BUCKETS_TOO_BIG,
            train_ddp=WHOLE_BATCH_PER_RANK,
        ),
        "skips_a_collective": replacing("evaluate_accuracy_distributed", RANK_ZERO_SKIPS, NOTEBOOK),
        "deadlocks": replacing("evaluate_accuracy_distributed", EVERY_RANK_SENDS_FIRST, NOTEBOOK),
    }
    for name, cells in students.items():
        write_notebook(root / "submitted" / name / MANIFEST.assignment / NOTEBOOK, *cells)
    out = root / "results.json"
    try:
        proc = subprocess.run(
            [
                python(), "-m", "grader", "grade", str(root / "submitted"), "--jobs", "2",
                "--check-timeout", "5", "--json", str(out),
            ],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
    finally:
        server.close()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = {s["id"]: s for s in json.loads(out.read_text())["submissions"]}
    return {"report": report, "connections": server.connections}


def scores(sub) -> dict[str, float]:
    return {e["name"]: e["score"] for e in sub["exercises"] if e["name"] in POINTS}


def text(sub, exercise) -> str:
    return " ".join(
        c["message"] + " " + c["hint"]
        for e in sub["exercises"]
        if e["name"] == exercise
        for c in e["checks"]
    )


def others_full(sub, *but: str) -> None:
    got = scores(sub)
    assert {k: v for k, v in got.items() if k not in but} == {
        k: v for k, v in POINTS.items() if k not in but
    }, got


def test_a_deadlocked_ring_fails_clearly_and_costs_only_the_ring(distributed_class):
    sub = distributed_class["report"]["sends_first"]
    assert scores(sub)["ring_allreduce"] == 0
    said = text(sub, "ring_allreduce")
    assert "a deadlock" in said and "waiting in torch.distributed's send" in said
    assert "blocking send on every rank at once waits forever" in said
    # The smallest group's deadlock decides; the larger groups, stopped then, are not named.
    assert "with 2 processes" in said and "was stopped: the group of" not in said
    others_full(sub, "ring_allreduce")


def test_one_deadlock_met_by_several_cases_is_one_cause_shown_once(distributed_class):
    """Each case of the ring deadlocks on its own, and its message says how long its ranks
    idled: the checks' `cause` is one, and the text report shows the deadlock once."""
    from grader.base.results import SubmissionResult
    from grader.report.text import render_exercise

    result = SubmissionResult.from_dict(distributed_class["report"]["sends_first"])
    (ring,) = [e for e in result.exercises if e.name == "ring_allreduce"]
    hung = [c for c in ring.checks if "a deadlock" in c.message]
    assert len(hung) >= 2 and len({c.cause for c in hung}) == 1 and hung[0].cause, hung
    shown = render_exercise(ring)
    assert shown.count("a deadlock") == 1 and "the same as" in shown, shown


def test_student_code_cannot_start_processes_of_its_own(distributed_class):
    sub = distributed_class["report"]["escapes"]
    assert scores(sub)["average_gradients"] == 0
    assert "starting processes is not allowed while grading" in text(sub, "average_gradients")
    others_full(sub, "average_gradients", "ring_allreduce")


def test_the_ranks_reach_no_network_but_their_own_loopback(distributed_class):
    sub = distributed_class["report"]["escapes"]
    assert distributed_class["connections"] == 0
    assert scores(sub)["ring_allreduce"] == 0
    assert "network use is not allowed while grading" in text(sub, "ring_allreduce")
    others_full(sub, "average_gradients", "ring_allreduce")


def test_ranks_that_spin_hit_the_processor_time_limit(distributed_class):
    sub = distributed_class["report"]["stops"]
    assert scores(sub)["evaluate_accuracy_distributed"] == 0
    said = text(sub, "evaluate_accuracy_distributed")
    assert "s of processor time between them and were stopped" in said
    others_full(sub, "evaluate_accuracy_distributed", "train_ddp")


def test_a_rank_that_leaves_is_named(distributed_class):
    sub = distributed_class["report"]["stops"]
    assert scores(sub)["train_ddp"] == 0
    assert "rank 1's process exited with code 1" in text(sub, "train_ddp")
    others_full(sub, "evaluate_accuracy_distributed", "train_ddp")


def test_replacing_torch_distributed_voids_the_distributed_exercises(distributed_class):
    sub = distributed_class["report"]["fakes_all_reduce"]
    assert set(scores(sub).values()) == {0}
    assert "changed the grader's own code or torch" in text(sub, "average_gradients")
    assert "torch.distributed" in text(sub, "average_gradients")


def test_changing_the_grader_inside_a_rank_fails_the_runs_there(distributed_class):
    sub = distributed_class["report"]["fakes_the_sums"]
    assert scores(sub)["ring_allreduce"] == 0
    said = text(sub, "ring_allreduce")
    assert "changed the grader's own code or torch" in said
    assert "grader.exercises.ring_allreduce.checks.all_reduce" in said
    others_full(sub, "ring_allreduce")


def checks_of(sub, exercise) -> dict[str, dict]:
    (found,) = [e for e in sub["exercises"] if e["name"] == exercise]
    return {c["name"]: c for c in found["checks"]}


def test_a_gradient_scaled_in_place_before_its_all_reduce_is_still_that_gradient(
    distributed_class,
):
    """The calls are known by the tensor passed, whatever its values: `grad.div_(world)`,
    then `all_reduce(grad)`, one call per parameter, is right."""
    sub = distributed_class["report"]["scales_first"]
    assert scores(sub)["average_gradients"] == POINTS["average_gradients"]


def test_a_bucket_over_the_limit_is_named_and_costs_one_check(distributed_class):
    """The bucket holds the gradients it really held, and is over the limit; the counts of
    calls, wrong for the same cause, keep their points and say why."""
    sub = distributed_class["report"]["scales_first"]
    checks = checks_of(sub, "average_gradients_bucketed")
    over = checks["no_bucket_over_the_limit"]
    assert not over["passed"] and "(grad 5, grad 4, grad 3, grad 2)" in over["message"]
    for name in ("one_all_reduce_per_bucket", "right_means_and_bucket_count_with_another_size"):
        assert checks[name]["passed"], checks[name]
        assert checks[name]["kept_for"] == "no_bucket_over_the_limit", checks[name]
    assert scores(sub)["average_gradients_bucketed"] == POINTS["average_gradients_bucketed"] - 1


def test_a_rank_batch_of_the_global_size_costs_the_share_check_alone(distributed_class):
    sub = distributed_class["report"]["scales_first"]
    checks = checks_of(sub, "train_ddp")
    assert [n for n, c in checks.items() if not c["passed"]] == [
        "each_rank_takes_its_share_of_the_global_batch"
    ]
    kept = checks["matches_one_process_with_other_settings"]
    assert kept["passed"] and kept["kept_for"] == "each_rank_takes_its_share_of_the_global_batch"


def test_a_skipped_collective_costs_the_collective_checks_not_the_eval_mode(distributed_class):
    """Rank 0 skips the all_reduce: the others wait, and the checks of the result fail; the
    eval mode is judged on rank 0, which returned, and passes."""
    sub = distributed_class["report"]["skips_a_collective"]
    checks = checks_of(sub, "evaluate_accuracy_distributed")
    assert not checks["every_rank_returns_the_accuracy_of_the_whole_set"]["passed"]
    assert (
        "skipped a call that the others made"
        in checks["every_rank_returns_the_accuracy_of_the_whole_set"]["message"]
    )
    assert checks["evaluates_in_eval_mode"]["passed"]
    assert checks["evaluates_in_eval_mode"]["message"] == ""  # judged, on rank 0
    others_full(sub, "evaluate_accuracy_distributed")


def test_a_deadlock_with_no_rank_to_judge_keeps_the_other_checks_points(distributed_class):
    sub = distributed_class["report"]["deadlocks"]
    checks = checks_of(sub, "evaluate_accuracy_distributed")
    assert not checks["every_rank_returns_the_accuracy_of_the_whole_set"]["passed"]
    eval_mode = checks["evaluates_in_eval_mode"]
    assert (
        eval_mode["passed"] and "could not be judged: the ranks deadlocked" in eval_mode["message"]
    )
    others_full(sub, "evaluate_accuracy_distributed")


# Scripts run in a fresh Python: the distributed notebook loaded from FOLDER, and a pool of
# ranks open for what follows (the test prints its findings as the last line, in JSON).
IN_A_POOL = """
import json

from grader.base.grading_devices import grading_devices
from grader.api import Context, Student
from grader.judge.registry import diagnoser, public_checks
from grader.judge.verdicts import judge_exercise
from grader.load.notebook import load_notebook
from grader.manifest import REPO, load_manifest
from grader.ranks.pools import rank_pools
from grader.load.runner import run_checks

manifest = load_manifest()
path = REPO / FOLDER / manifest.assignment / "distributed.ipynb"
namespace = load_notebook(path, manifest.training_functions, module_name="nb").namespace
ctx = Context(0, grading_devices(2))
"""


def in_a_pool(folder: str, body: str) -> dict:
    """Run `body` after IN_A_POOL on the notebook in `folder`; return what it printed last."""
    script = IN_A_POOL.replace("FOLDER", repr(folder)) + body
    proc = subprocess.run([python(), "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


SHARED_RANKS = """
scores = {}
with rank_pools(namespace, "distributed.ipynb") as pool:
    for exercise_id in ("average_gradients", "evaluate_accuracy_distributed"):
        ex = manifest.exercise(exercise_id)
        checks = public_checks(ex)
        outcomes = run_checks(checks, Student(namespace, ex.function, "distributed.ipynb"), ctx)
        judged = judge_exercise(ex.id, ex.function, checks, outcomes, ctx, diagnoser(ex))
        scores[ex.id] = [c.passed for c in judged.checks]
print(json.dumps({"forks": pool.forks, "scores": scores}))
"""


@pytest.mark.slow
def test_the_exercises_of_a_notebook_share_their_ranks():
    """One pool serves the cases of every exercise of a notebook (the grading child opens it
    when the notebook has loaded): each group size is forked once, and each exercise's cases
    call that exercise's function."""
    said = in_a_pool("solutions", SHARED_RANKS)
    assert said["forks"] == 2 + 3 + 4
    assert said["scores"]["average_gradients"] and all(said["scores"]["average_gradients"])
    evaluate = said["scores"]["evaluate_accuracy_distributed"]
    assert evaluate and all(evaluate)


HOLDING = """
import contextlib

from grader.load.reference import held_sources
from grader.ranks.pools import reference_in_ranks
from grader.sandbox.child import run_reference_cells


def broken(*args, **kwargs):
    raise RuntimeError("this evaluation is wrong")


namespace["evaluate_accuracy_distributed"] = broken  # a mistake that train_ddp holds right
said = {}
with rank_pools(namespace, "distributed.ipynb", run_reference_cells) as pool:
    for exercise_id in ("evaluate_accuracy_distributed", "train_ddp", "average_gradients"):
        ex = manifest.exercise(exercise_id)
        checks = public_checks(ex)
        holds = sorted({name for c in checks for name in c.case.holds})
        cells = held_sources("distributed.ipynb", holds) if holds else []
        held = run_reference_cells(cells) if cells else None
        student = Student(namespace, ex.function, "distributed.ipynb")
        with reference_in_ranks(cells, held, holds) if cells else contextlib.nullcontext():
            outcomes = run_checks(checks, student, ctx, held=held)
        judged = judge_exercise(ex.id, ex.function, checks, outcomes, ctx, diagnoser(ex))
        said[ex.id] = {"passed": [c.passed for c in judged.checks], "forks": pool.forks}
    said["student's again"] = namespace["evaluate_accuracy_distributed"] is broken
print(json.dumps(said))
"""


@pytest.mark.slow
def test_an_exercise_that_holds_a_name_right_uses_the_ranks_there_and_stops_them():
    """train_ddp's case holds evaluate_accuracy_distributed right with the reference's: the
    ranks forked for earlier exercises run the reference's cells and hold it right for the
    run (a wrong evaluation costs train_ddp nothing), and stop when train_ddp ends, so that
    no rank that has seen the reference runs another exercise's cases."""
    said = in_a_pool("solutions", HOLDING)
    assert said["evaluate_accuracy_distributed"]["forks"] == 2 + 3 + 4
    evaluate = said["evaluate_accuracy_distributed"]["passed"]
    # the student's own (broken) evaluation is what its checks judged: the check that owns
    # the cause fails, and the others, which name it, keep their points
    assert evaluate and not evaluate[0]
    assert said["train_ddp"]["passed"] and all(said["train_ddp"]["passed"])
    assert said["train_ddp"]["forks"] == 2 + 3 + 4  # no rank forked for it
    assert said["average_gradients"]["forks"] == 2 * (2 + 3 + 4)  # new ones after it
    assert said["average_gradients"]["passed"] and all(said["average_gradients"]["passed"])
    assert said["student's again"]


STUBS = """
said = {}
with rank_pools(namespace, "distributed.ipynb") as pool:
    for exercise_id in ("ring_allreduce", "average_gradients", "train_ddp"):
        ex = manifest.exercise(exercise_id)
        student = Student(namespace, ex.function, "distributed.ipynb")
        outcomes = run_checks(public_checks(ex), student, ctx)
        errors = sorted({(o.error.type, o.error.message) for o in outcomes.values()})
        said[exercise_id] = {"errors": errors, "forks": pool.forks}
print(json.dumps(said))
"""


@pytest.mark.slow
def test_an_untouched_stub_stops_its_cases_before_any_rank_starts():
    """The released notebook's stubs: ring_allreduce's and average_gradients' only raise, so
    their cases stop at once, with the error each rank would have met; train_ddp's stub
    starts with dist.get_rank(), so its ranks start and meet it there. Either way the case
    ends as a stub, with the notebook's message."""
    said = in_a_pool("exercises", STUBS)
    stub = [["NotImplementedError", "write this function, then run its check"]]
    assert {ex: r["errors"] for ex, r in said.items()} == dict.fromkeys(said, stub)
    assert said["ring_allreduce"]["forks"] == said["average_gradients"]["forks"] == 0
    assert said["train_ddp"]["forks"] == 2 + 3 + 4


def test_only_a_body_that_does_nothing_but_raise_is_an_untouched_stub():
    from grader.api import MissingFunction, Student
    from grader.ranks.groups import untouched_stub

    namespace: dict = {}
    exec(
        "def stub(x):\n"
        '    """Doc."""\n'
        "    # YOUR CODE HERE\n"
        "    raise NotImplementedError('write this function')\n"
        "def bare(x):\n    raise NotImplementedError\n"
        "def prints_first(x):\n    print(x)\n    raise NotImplementedError('no')\n"
        "def formatted(x):\n    raise NotImplementedError(f'{x}')\n"
        "def sometimes(x):\n    if x:\n        return x\n    raise NotImplementedError('no')\n",
        namespace,
    )
    shadowing: dict = {}
    exec(
        "NotImplementedError = RuntimeError\n"
        "def shadowed(x):\n    raise NotImplementedError('no')\n",
        shadowing,
    )
    namespace["shadowed"] = shadowing["shadowed"]
    assert str(untouched_stub(namespace["stub"])) == "write this function"
    assert str(untouched_stub(namespace["bare"])) == ""
    for name in ("prints_first", "formatted", "sometimes", "shadowed"):
        assert untouched_stub(namespace[name]) is None, name
    assert untouched_stub(print) is None
    assert untouched_stub(lambda x: x) is None
    with pytest.raises(MissingFunction, match="keep the name"):
        untouched_stub(Student({}, "ring_allreduce", "distributed.ipynb").fn)


def test_the_judges_network_is_the_same_whatever_another_thread_does_to_the_global_seed():
    """The class grader judges submissions in threads: the network whose whole-batch gradients
    the ranks' must equal cannot depend on torch's global generator, which another thread may
    seed at any moment (a correct submission once lost average_gradients that way)."""
    import sys
    import threading

    import torch

    from grader.exercises.average_gradients.checks import grad_model

    wanted = [p.detach().clone() for p in grad_model(7).parameters()]
    assert wanted, "grad_model(7) has no parameters"
    stop = threading.Event()

    def reseed():
        seed = 0
        while not stop.is_set():
            seed += 1
            torch.manual_seed(seed)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    other = threading.Thread(target=reseed)
    other.start()
    try:
        built = [[p.detach().clone() for p in grad_model(7).parameters()] for _ in range(100)]
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(interval)
    differing = sum(not all(map(torch.equal, b, wanted)) for b in built)
    assert differing == 0, f"{differing} of 100 networks built for seed 7 differed"


def test_a_judges_computation_that_never_answers_from_its_copy_is_made_here(tmp_path, monkeypatch):
    """A forked copy can hang (on a lock another thread held when it was forked); the
    grader must not wait for it forever: after `wait` seconds it computes the value itself.
    (Whatever this process ran before, autograd's threads are taken as not started, so that
    a copy is forked: where they run, `apart` computes here at once, and no copy is made.)"""
    import os
    import time

    import grader.ranks.apart
    from grader.api import apart

    monkeypatch.setattr(grader.ranks.apart, "autograd_threads_started", lambda: False)

    here = os.getpid()
    copies = tmp_path / "copies"

    def stuck_in_a_copy():
        if os.getpid() != here:
            copies.write_text(str(os.getpid()))
            time.sleep(60)
        return os.getpid()

    assert apart(stuck_in_a_copy, wait=3.0) == here
    copy = int(copies.read_text())
    with pytest.raises(ChildProcessError):  # the stuck copy was stopped and reaped
        os.waitpid(copy, os.WNOHANG)
