"""The seed notes' own code, moved into the lab's notebooks, gets what a teacher would give.

The notes the lab grew from (`../shared/seeds/` beside the repository, or `$DPLAB_SEEDS`)
hold real student code. Each function is moved the way a student moving from the book to
the lab would move it: pasted into its stub cell of the released notebook; for the two
`train` functions, under the lab's `def` line and given first lines (so that `data=` and
`devices=` stay injectable), with the student's own lines that load the data and pick the
devices taken out (a differently named device list becomes `devices`). Then the class is
graded with `python -m grader grade --jobs 2`, once in a run of the tests (tests/corpora.py).
The test is skipped where the notes are absent.

The notes' authors read the book in Chinese: each seed is also moved into the Chinese
notebooks (exercises/zh_CN/), graded in the same class, and must get the same verdict on every
check, with its messages in Chinese.
"""

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from grader.manifest import REPO, exercises_dir, load_manifest
from grader.tools.authoring import cells_by_grade_id, filled_in
from tests import corpora

MANIFEST = load_manifest()
SEEDS = Path(os.environ.get("DPLAB_SEEDS", REPO.parent / "shared" / "seeds"))
RELEASES = {"": exercises_dir(), "_zh_CN": REPO / "exercises" / "zh_CN" / MANIFEST.assignment}
# The first line of the code stub in each release (nbgrader's default, and i18n/'s)
STUB_MARKS = (
    "# YOUR CODE HERE",
    tomllib.loads((REPO / "i18n/zh_CN/release.toml").read_text())["code_stub"].splitlines()[0],
)
CJK = re.compile(r"[\u4e00-\u9fff]")

# (seed, exercise, which `def` of the exercise's function in the notes, counting from 0)
MOVED = [
    ("000", "get_params", 0),
    ("000", "allreduce", 0),
    ("000", "split_batch", 0),
    ("000", "train_batch", 0),
    ("000", "train_loop", 0),
    ("001", "allreduce", 0),
    ("001", "split_batch", 0),
    ("002", "allreduce", 0),
    ("002", "split_batch", 0),
    ("002", "train_batch", 0),
    ("002", "train_loop", 0),
    ("003", "resnet18", 0),
    ("003", "train_dataparallel", 0),
    ("004", "try_gpu", 0),
    ("004", "try_all_gpus", 0),
    ("004", "get_params", 0),
    ("004", "allreduce", 0),
    ("004", "split_batch", 0),
    ("004", "train_batch", 0),
    ("004", "train_loop", 0),
    ("004", "resnet18", 0),
    ("004", "train_dataparallel", 1),
]

# What a teacher gives: the checks that must fail (none for the exercises not listed).
TEACHER = {
    # the book's p.to(device): on their own device the copies are the originals; 9/11 (the
    # hidden check on nn.Parameters sees the same cause, and keeps its points)
    ("000", "get_params"): {"copies_are_independent_of_the_originals"},
    ("000", "split_batch"): {"rejects_mismatched_lengths_with_a_message"},  # a bare assert
    ("000", "train_loop"): {
        "prints_the_summary_line",  # {x :.2f } raises at the very end
        "returns_the_accuracy_history",
    },
    # data[i] = ... rebinds: the tensors given never get the sum; 9/11 (the hidden check sees
    # the same cause, and keeps its points)
    ("001", "allreduce"): {"writes_into_the_tensors_it_was_given"},
    ("001", "split_batch"): "all",  # `y. devices`: it always raises; 0/8
    ("002", "split_batch"): {"rejects_mismatched_lengths_with_a_message"},
    ("002", "train_loop"): {"returns_the_accuracy_history"},
    ("003", "train_dataparallel"): {
        "moves_the_net_to_the_first_device",
        "returns_the_accuracy_history",
    },
    ("004", "get_params"): {"copies_are_independent_of_the_originals"},
    ("004", "split_batch"): {"rejects_mismatched_lengths_with_a_message"},
    ("004", "train_loop"): {"returns_the_accuracy_history"},
    ("004", "resnet18"): {"stem_is_3x3_stride_1_without_max_pooling"},  # 7x7 and max-pool
    ("004", "train_dataparallel"): {
        "moves_the_net_to_the_first_device",
        "returns_the_accuracy_history",
    },
}

GIVEN = re.compile(r"^\s+train_iter, test_iter = ")
DEVICE_LIST = re.compile(r"^(\s+)(\w+) = \[\s*d2l\.try_gpu\(i\) for i in range\(\w+\)\s*\]\s*$")


def seed_text(seed: str) -> str:
    (path,) = SEEDS.glob(f"{seed}_*.txt")
    return path.read_text(encoding="utf-8")


def functions_in(text: str, name: str) -> list[str]:
    """Return each top-level definition of `name` in the notes, as source."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"def {name}("):
            body = [line]
            for after in lines[i + 1 :]:
                if after.strip() and not after[0].isspace():
                    break
                body.append(after)
            found.append("\n".join(body).rstrip() + "\n")
    return found


def moved(function: str, exercise, release: Path) -> str:
    """Return the student's function as it lands in the stub cell of `exercise` (in the
    notebooks of `release`)."""
    if not exercise.trains:
        return function
    stub = "".join(
        cells_by_grade_id(release / exercise.notebook)[f"{exercise.id}-solution"]["source"]
    )
    head = re.split("|".join(map(re.escape, STUB_MARKS)), stub)[0].rstrip() + "\n"
    body = []
    for line in function.splitlines()[1:]:
        if GIVEN.match(line):
            continue
        if m := DEVICE_LIST.match(line):
            if m.group(2) != "devices":
                body.append(f"{m.group(1)}{m.group(2)} = devices")
            continue
        body.append(line)
    return head + "\n".join(body) + "\n"


def write_seed_class(root: Path) -> None:
    """Write a submission of each seed under `root`, in each release (English, Chinese)."""
    for suffix, release in RELEASES.items():
        by_seed: dict[str, dict[str, dict[str, str]]] = {}
        for seed, exercise_id, which in MOVED:
            ex = MANIFEST.exercise(exercise_id)
            source = functions_in(seed_text(seed), ex.function)[which]
            answers = by_seed.setdefault(seed, {}).setdefault(ex.notebook, {})
            answers[f"{ex.id}-solution"] = moved(source, ex, release)
        for seed, notebooks in by_seed.items():
            folder = root / f"seed{seed}{suffix}" / MANIFEST.assignment
            folder.mkdir(parents=True)
            for notebook in MANIFEST.notebooks:
                nb = filled_in(release / notebook, notebooks.get(notebook, {}))
                (folder / notebook).write_text(json.dumps(nb), encoding="utf-8")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once in the run (tests/corpora.py); each report by seed."""
    if not SEEDS.is_dir():
        pytest.skip(f"the seed notes are not here ({SEEDS})")
    report = corpora.graded(tmp_path_factory, "seeds").report
    return {name.removeprefix("seed"): sub for name, sub in report.items()}


def exercise(sub, name):
    return next(e for e in sub["exercises"] if e["name"] == name)


@pytest.mark.parametrize(("seed", "exercise_id", "which"), MOVED, ids=lambda v: str(v))
def test_the_seed_gets_what_a_teacher_gives(graded, seed, exercise_id, which):
    result = exercise(graded[seed], exercise_id)
    failing = {c["name"] for c in result["checks"] if not c["passed"]}
    wanted = TEACHER.get((seed, exercise_id), set())
    if wanted == "all":
        assert result["score"] == 0
        return
    messages = {c["name"]: c["message"] for c in result["checks"] if not c["passed"]}
    assert failing == wanted, messages
    assert result["score"] > 0  # one slip never costs a whole exercise


@pytest.mark.parametrize("seed", sorted({seed for seed, _, _ in MOVED}))
def test_the_seed_in_the_chinese_notebooks_gets_the_same_grade(graded, seed):
    """The same code, in the Chinese notebooks: the same verdict and points on every check
    (graded in the same class as the English), said in Chinese."""
    english, chinese = graded[seed], graded[f"{seed}_zh_CN"]
    assert chinese["score"] == english["score"]
    for en, zh in zip(english["exercises"], chinese["exercises"], strict=True):
        verdicts = [(c["name"], c["passed"], c["points"]) for c in en["checks"]]
        assert [(c["name"], c["passed"], c["points"]) for c in zh["checks"]] == verdicts
        for c in zh["checks"]:
            if not c["passed"] and c["hint"]:
                assert CJK.search(c["hint"]), c["hint"]


def test_the_rebinding_allreduce_is_named(graded):
    result = exercise(graded["001"], "allreduce")
    assert result["score"] == 9
    check = next(c for c in result["checks"] if c["name"] == "writes_into_the_tensors_it_was_given")
    assert "only makes the list point at a new tensor" in check["hint"]


def test_the_typo_in_split_batch_is_named(graded):
    result = exercise(graded["001"], "split_batch")
    calling = [c for c in result["checks"] if "calling `split_batch` raised" in c["message"]]
    assert calling, "no check of split_batch says what calling it did"
    assert all("`y. devices`" in c["hint"] for c in calling)


def test_the_aliasing_get_params_is_named(graded):
    for seed in ("000", "004"):
        result = exercise(graded[seed], "get_params")
        assert result["score"] == 9
        check = next(
            c for c in result["checks"] if c["name"] == "copies_are_independent_of_the_originals"
        )
        assert "returns the very same tensor" in check["hint"]


def test_the_seeds_loops_keep_most_points(graded):
    for seed in ("000", "002", "004"):
        assert exercise(graded[seed], "train_loop")["score"] >= 7
