"""Outside code scores what a teacher would give it, on any machine.

The submissions in tests/outside/ are written in the habits of each edition of the book,
and, for the distributed notebook the book has no section for, of PyTorch's own tutorials;
for the sharded notebook, of ZeRO's implementations and of course work on them (see its
README). Each gets full marks but for its deliberate slips, and each slip costs
only the check about it. The grade is the same with stand-in devices and with
DPLAB_DEVICES=cpu, and, where there is a GPU, with the GPU and without it.
"""

import json
import os
import re
import subprocess

import pytest

from dplab.devices import num_gpus
from grader.manifest import REPO, load_manifest
from tests.conftest import note_texts, notebook_from_script, python

MANIFEST = load_manifest()
OUTSIDE = REPO / "tests" / "outside"

# The checks each submission must fail, its deliberate slips, one check each, and words of
# the reason each gives. The distributed notebook's are graded in the fence, loader workers
# and pinned memory included (pytorch_examples).
SLIPS = {
    "d2l_zh_2_0": {
        "split_batch": {"rejects_mismatched_lengths_with_a_message": "with an empty message"},
        "train_loop": {"returns_the_accuracy_history": "returned None"},
        "train_dataparallel": {
            "moves_the_net_to_the_first_device": "cpu",
            "returns_the_accuracy_history": "returned None",
        },
    },
    "d2l_en_1_0": {
        "try_all_gpus": {"gives_the_cpu_when_there_is_no_gpu": "cpu"},
        "train_dataparallel": {
            "moves_the_net_to_the_first_device": "cpu",
            "returns_the_accuracy_history": "returned None",
        },
    },
    "d2l_mxnet_port": {
        "split_batch": {"shard_sizes_follow_torch_chunk": "cannot split 5 examples evenly"},
    },
    "d2l_zh_paddle": {},
    "d2l_zh_tensorflow": {},
    "dive_into_dl_pytorch": {
        "get_params": {"copies_are_independent_of_the_originals": "same memory"},
    },
    "pytorch_dp_tutorial": {},
    # torch.cuda.comm and nn.parallel's functional API, which the stand-ins run as GPUs do.
    "pytorch_functional": {},
    "torchvision_resnet": {
        "resnet18": {"names_its_stages_like_the_book": "'layer1'"},
    },
    "pytorch_tutorial": {
        "ring_allreduce": {"each_rank_sends_two_n_minus_one_chunks": "sent 48 elements"},
        "average_gradients": {"skips_frozen_parameters": "'NoneType' object has no attribute"},
        "average_gradients_bucketed": {
            "buckets_start_from_the_last_parameter": "first bucket held ['grad 0', 'grad 1']"
        },
        "evaluate_accuracy_distributed": {"evaluates_in_eval_mode": "ran in training mode"},
    },
    "pytorch_examples": {},
    "course_buckets": {},
    # The sharded notebook's. cs336_sharded gives each rank whole parameters and broadcasts
    # them from their owner: another route to stage 1, which must get full marks.
    "cs336_sharded": {},
    "zero_redundancy": {
        "memory_per_rank": {"ddp_holds_everything_on_every_rank": "DDP with Adam over 1 ranks"},
    },
    "picotron_dp": {
        "reduce_scatter": {
            "keeps_dtypes_and_sums_integers_exactly": "rank 0's call 1 (int64, int32 and float64)"
        },
    },
    "deepspeed_words": {},
    # The third collection (issue 56), from sources the first two do not use.
    "jax_pmap_port": {},
    "uvadlc_lightning": {},
    "horovod_examples": {
        "evaluate_accuracy_distributed": {
            "every_rank_returns_the_accuracy_of_the_whole_set": "correct over total"
        },
    },
    "fairscale_fsdp": {},
}
# Submissions whose fair grade (SLIPS above) the grader does not give yet: each reason names
# the checks that charge them unfairly. Remove an entry once the grader gives the fair grade.
UNFAIR: dict[str, str] = {}
BOOK = ("d2l_zh_2_0", "d2l_en_1_0")
# The submissions graded with DPLAB_DEVICES=cpu as well: those of the first two notebooks,
# and the sharded notebook's (whose issue asks for it, though its ranks compute on the CPU
# whatever DPLAB_DEVICES says, as the distributed notebook's do).
ON_THE_CPU = tuple(
    edition
    for edition in SLIPS
    if {"from_scratch.ipynb", "concise.ipynb", "sharded.ipynb"}
    & {f"{p.stem}.ipynb" for p in (OUTSIDE / edition).glob("*.py")}
)


def slipped(edition: str) -> dict[str, set[str]]:
    """Return, per exercise, the checks the edition's slips must fail."""
    return {exercise: set(checks) for exercise, checks in SLIPS[edition].items()}


def notebooks_of(edition: str) -> list[str]:
    """Return the notebooks an edition's submission hands in (those it has a script for)."""
    return [
        nb
        for nb in MANIFEST.notebooks
        if (OUTSIDE / edition / nb.replace(".ipynb", ".py")).exists()
    ]


JOBS = str(max(2, (os.cpu_count() or 2) // 4))  # 2 here; more on a GPU server's cores


def write_class(root, editions=tuple(SLIPS)):
    """Write each edition's submission as a student folder of notebooks under `root`."""
    for edition in editions:
        for notebook in notebooks_of(edition):
            script = OUTSIDE / edition / notebook.replace(".ipynb", ".py")
            notebook_from_script(script, root / edition / MANIFEST.assignment / notebook)
    return root


def grade(root, **env) -> dict:
    """Grade the class under `root` with the grader's command line; return its report."""
    out = root / "report.json"
    proc = subprocess.run(
        [python(), "-m", "grader", "grade", str(root), "--jobs", JOBS, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {s["id"]: s for s in json.loads(out.read_text())["submissions"]}


def handed_in(sub, edition: str) -> list[dict]:
    """Return the exercises of the notebooks the edition's submission hands in."""
    notebooks = notebooks_of(edition)
    return [e for e in sub["exercises"] if MANIFEST.exercise(e["name"]).notebook in notebooks]


def failed(sub, edition: str) -> dict[str, set[str]]:
    """Return, per exercise handed in, the names of the checks that failed (exercises with
    none left out)."""
    found = {}
    for e in handed_in(sub, edition):
        names = {c["name"] for c in e["checks"] if not c["passed"]}
        if names:
            found[e["name"]] = names
    return found


def verdicts(sub) -> dict[str, list[tuple[str, bool]]]:
    return {e["name"]: [(c["name"], c["passed"]) for c in e["checks"]] for e in sub["exercises"]}


@pytest.fixture(scope="module")
def on_stand_ins(tmp_path_factory):
    return grade(write_class(tmp_path_factory.mktemp("outside")), DPLAB_DEVICES="stand-in")


@pytest.fixture(scope="module")
def on_the_cpu(tmp_path_factory):
    """The submissions of ON_THE_CPU graded with DPLAB_DEVICES=cpu. The distributed notebook
    is left out: its ranks compute on the CPU (gloo) whatever DPLAB_DEVICES says."""
    root = write_class(tmp_path_factory.mktemp("outside-cpu"), ON_THE_CPU)
    return grade(root, DPLAB_DEVICES="cpu")


def header_slips(edition: str) -> set[str]:
    """Return the checks the headers of an edition's scripts say its slips cost (`-> name`)."""
    named = set()
    for script in (OUTSIDE / edition).glob("*.py"):
        header = script.read_text(encoding="utf-8").split("# %%")[0]
        named |= set(re.findall(r"-> (\w+)", header)) - {"no"}  # "-> no check": a habit
    return named


def test_every_outside_submission_is_graded_with_the_slips_its_header_names():
    folders = {p.name for p in OUTSIDE.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert folders == set(SLIPS)
    for edition, exercises in SLIPS.items():
        assert header_slips(edition) == set().union(*exercises.values()), edition


@pytest.mark.parametrize(
    "edition",
    [
        pytest.param(e, marks=pytest.mark.xfail(strict=True, reason=UNFAIR[e]))
        if e in UNFAIR
        else e
        for e in sorted(SLIPS)
    ],
)
def test_each_slip_costs_only_its_own_check(on_stand_ins, edition):
    sub = on_stand_ins[edition]
    exercises = handed_in(sub, edition)
    messages = {
        (e["name"], c["name"]): c["message"]
        for e in exercises
        for c in e["checks"]
        if not c["passed"]
    }
    assert failed(sub, edition) == slipped(edition), messages
    for exercise, reasons in SLIPS[edition].items():
        for check, reason in reasons.items():
            assert reason in messages[(exercise, check)], messages[(exercise, check)]
    lost = sum(c["max_points"] for e in exercises for c in e["checks"] if not c["passed"])
    assert sub["score"] == sum(e["max_score"] for e in exercises) - lost


def test_the_books_cuda_synchronize_runs_on_stand_ins(on_stand_ins):
    for sub in (on_stand_ins[edition] for edition in BOOK):
        loop = next(e for e in sub["exercises"] if e["name"] == "train_loop")
        passed = {c["name"] for c in loop["checks"] if c["passed"]}
        assert {"visits_every_batch_once_per_epoch", "accuracy_rises_above_chance"} <= passed


def test_the_chinese_summary_line_counts_as_the_books(on_stand_ins):
    loop = next(e for e in on_stand_ins["d2l_zh_2_0"]["exercises"] if e["name"] == "train_loop")
    assert next(c for c in loop["checks"] if c["name"] == "prints_the_summary_line")["passed"]


def test_the_final_training_calls_are_not_run(on_stand_ins):
    for edition in BOOK:
        assert any(
            "did not run this call of train(...)" in n for n in note_texts(on_stand_ins[edition])
        )


def test_launches_at_the_top_level_are_not_run_and_cost_nothing(on_stand_ins):
    """The tutorial-style notebook launches a demo and its training run at the top level: the
    grader runs neither, and notes nothing against them."""
    sub = on_stand_ins["pytorch_tutorial"]
    assert [n for n in note_texts(sub) if "distributed.ipynb" in n] == []
    assert failed(sub, "pytorch_tutorial") == slipped("pytorch_tutorial")


def test_the_grade_is_the_same_with_dplab_devices_cpu(on_stand_ins, on_the_cpu):
    for edition in ON_THE_CPU:
        assert verdicts(on_the_cpu[edition]) == verdicts(on_stand_ins[edition]), edition


@pytest.mark.gpu
@pytest.mark.skipif(num_gpus() < 1, reason="needs a CUDA GPU")
def test_the_grade_is_the_same_with_the_gpu_and_without(tmp_path):
    with_gpus = grade(write_class(tmp_path / "gpu"), DPLAB_DEVICES="auto")
    without = grade(write_class(tmp_path / "cpu"), DPLAB_DEVICES="auto", CUDA_VISIBLE_DEVICES="")
    for edition in SLIPS:
        assert verdicts(with_gpus[edition]) == verdicts(without[edition]), edition
        if edition not in UNFAIR:
            assert failed(with_gpus[edition], edition) == slipped(edition)
