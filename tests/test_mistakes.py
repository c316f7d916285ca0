"""The catalogue of known mistakes: each is caught by the right check, with the right hint."""

import importlib

import pytest

from grader.base.results import ExerciseResult, SubmissionResult
from grader.exercises.catalogue import mistakes_of, variant
from grader.exercises.train_dataparallel.private import mistakes as train_dataparallel
from grader.manifest import load_manifest
from tests import corpora
from tests.conftest import fresh_solution, grade_in_process, grade_source, verdicts_of_source

# (The exercises whose cases start process groups are read from the catalogue graded as a
# class: slow.)
CATALOGUE = [
    pytest.param(
        ex,
        name,
        mistake,
        id=f"{ex.id}::{name}",
        marks=[getattr(pytest.mark, ex.id), *([pytest.mark.slow] if ex.distributed else [])],
    )
    for ex in load_manifest().exercises
    for name, mistake in mistakes_of(ex).items()
]


def test_every_exercise_has_catalogued_mistakes():
    for ex in load_manifest().exercises:
        assert mistakes_of(ex), f"{ex.id} has no catalogued mistakes"


def test_the_seed_mistakes_are_catalogued():
    """The mistakes recorded in the students' notes are all in the catalogue."""
    sources = {
        (ex.id, name): m.source
        for ex in load_manifest().exercises
        for name, m in mistakes_of(ex).items()
    }
    assert "data[i] = data[0].to" in sources[("allreduce", "rebinds_list_entries")]
    assert "require_grad_()" in sources[("get_params", "misspelt_requires_grad")]
    assert ".backward()" not in sources[("train_batch", "forgets_backward")]
    assert "allreduce" not in sources[("train_batch", "forgets_allreduce")]
    assert "X_shard.shape[0]" in sources[("train_batch", "divides_by_the_shard_size")]
    assert "for X, y in train_iter:\n        for epoch" in sources[("train_loop", "swapped_loops")]


def graded(exercise, name, mistake, tmp_path_factory, only=None) -> ExerciseResult:
    """The exercise graded with the mistake: in this process, on the `only` checks, where its
    cases run here; else (its cases start process groups) read from the catalogue graded as a
    class (tests/corpora.py), every check of the exercise graded."""
    if not exercise.distributed:
        return grade_source(exercise, mistake.source, only=only)
    k = [n for n, _ in corpora.CATALOGUE[exercise.id]].index(name)
    sub = corpora.graded(tmp_path_factory, "catalogue").report[corpora.catalogue_student(k)]
    (result,) = [e for e in SubmissionResult.from_dict(sub).exercises if e.name == exercise.id]
    return result


@pytest.mark.parametrize(("exercise", "name", "mistake"), CATALOGUE)
def test_mistake_is_caught_with_its_hint(exercise, name, mistake, tmp_path_factory):
    """Graded on the check that should catch it (and those it comes after) alone, so that only
    their cases run, or, for the exercises whose cases start process groups, in the catalogue
    graded as a class. Whole exercises are graded with catalogued mistakes in
    tests/test_nbgrader.py (the first notebook's) and tests/test_fast_path.py (all of them)."""
    result = graded(exercise, name, mistake, tmp_path_factory, only={mistake.fails})
    verdicts = {c.name: c for c in result.checks}
    assert mistake.fails in verdicts, f"{mistake.fails} is not a check of {exercise.id}"
    verdict = verdicts[mistake.fails]
    assert not verdict.passed, f"{name} passed {mistake.fails}"
    assert mistake.hint_mentions in verdict.hint, (
        f"{name} failed {mistake.fails} with the hint {verdict.hint!r}, "
        f"expected it to mention {mistake.hint_mentions!r}"
    )
    assert result.score < result.max_score


# The exercises graded in this process (not those whose cases start process groups).
IN_PROCESS = [p for p in CATALOGUE if not p.values[0].distributed]


@pytest.mark.parametrize(("exercise", "name", "mistake"), IN_PROCESS)
def test_one_mistake_is_charged_once(exercise, name, mistake):
    """Graded on every check of its exercise, hidden ones included, a catalogued mistake (one
    cause) loses the points of its own check and of no other, but for the checks it names in
    `also`, causes of their own. A check that saw nothing to judge (every call raised, or
    what it looks at is missing) charges nothing; a check that fails for the cause another
    check charges keeps its points and says so."""
    verdicts = verdicts_of_source(exercise, mistake.source)
    names = {v.result.name for v in verdicts}
    assert set(mistake.also) <= names, f"{name}: `also` names a check {exercise.id} lacks"
    own = next(v for v in verdicts if v.result.name == mistake.fails)
    assert not own.result.passed, f"{name} passed {mistake.fails}"
    charged = {v.result.name: v.result.message for v in verdicts if v.charged}
    allowed = {mistake.fails, *mistake.also}
    assert set(charged) <= allowed, {k: m for k, m in charged.items() if k not in allowed}
    for check in mistake.also:
        assert check in charged, f"{name} no longer costs {check}: take it out of `also`"


NEVER = [p for p in CATALOGUE if p.values[2].hints_never]


@pytest.mark.parametrize(("exercise", "name", "mistake"), NEVER)
def test_no_hint_names_a_mistake_that_was_not_made(exercise, name, mistake, tmp_path_factory):
    """Graded on every check of its exercise, no failed check hints at a mistake the code
    does not make (a hint is tied to what the check saw, not to the check)."""
    result = graded(exercise, name, mistake, tmp_path_factory)
    for c in result.checks:
        for words in mistake.hints_never:
            assert c.passed or words not in c.hint, f"{name}: {c.name} hinted {c.hint!r}"


def test_a_check_that_saw_no_finished_call_says_so():
    """Every call raised: the check has judged nothing, and says why it fails."""
    exercise = load_manifest().exercise("allreduce")
    mistake = mistakes_of(exercise)["calls_the_device_attribute"]
    result = grade_source(exercise, mistake.source)
    verdict = next(c for c in result.checks if c.name == mistake.fails)
    assert verdict.message.startswith(
        "could not judge this: every call of `allreduce` raised; the first: TypeError"
    ), verdict.message


def template_of(module) -> str | None:
    """Return a catalogue's template: the book's code (BOOK), or a right version (TEMPLATE)."""
    return getattr(module, "BOOK", None) or getattr(module, "TEMPLATE", None)


TEMPLATED = [
    pytest.param(ex, id=ex.id, marks=getattr(pytest.mark, ex.id))
    for ex in load_manifest().exercises
    if template_of(importlib.import_module(ex.mistakes))
]


@pytest.mark.parametrize("exercise", TEMPLATED)
def test_the_template_with_its_right_parts_gets_full_marks(exercise):
    """Each templated mistake is a right program with one part changed, and nothing else
    wrong."""
    module = importlib.import_module(exercise.mistakes)
    source = variant(template_of(module), module.RIGHT)
    assert "<<" not in source, f"{exercise.mistakes}: a part of the template has no right code"
    result = grade_source(exercise, source)
    failed = [c.name for c in result.checks if not c.passed]
    assert result.score == result.max_score, f"the right template failed {failed}"


def test_a_crash_on_one_list_size_costs_only_the_checks_about_sums():
    """An allreduce that refuses a list of one tensor (and is right otherwise) loses the check
    that every list holds the sum, and what waits on it, but not the check that it writes into
    the tensors it was given: that one is judged on the calls that finished."""
    exercise = load_manifest().exercise("allreduce")
    namespace = fresh_solution(exercise.notebook)
    source = """
def allreduce(data):
    assert len(data) > 1, "allreduce needs two or more tensors"
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)
"""
    exec(compile(source, "<refuses one tensor>", "exec"), namespace)
    result = grade_in_process(exercise, namespace)
    verdicts = {c.name: c for c in result.checks}
    failed = {name for name, c in verdicts.items() if not c.passed}
    assert "every_tensor_holds_the_sum" in failed
    assert "allreduce needs two or more tensors" in verdicts["every_tensor_holds_the_sum"].message
    assert verdicts["writes_into_the_tensors_it_was_given"].passed
    assert verdicts["book_demo_gives_threes_on_both_devices"].passed
    assert verdicts["matches_the_reference_on_random_lists"].passed


@pytest.mark.parametrize(
    ("body", "said"),
    [
        # PyTorch's own NotImplementedError (a Dataset without __getitem__): a crash like any
        pytest.param(
            "return torch.utils.data.Dataset()[0]",
            "raised NotImplementedError: Subclasses of Dataset should implement __getitem__",
            id="from PyTorch",
        ),
        # the student's own helper, still a stub: nothing is written there yet
        pytest.param("return split_rows(X, y, devices)", "is not written yet", id="a stub"),
    ],
)
def test_only_a_stubs_own_line_is_not_written_yet(body, said):
    exercise = load_manifest().exercise("split_batch")
    source = f"""
def split_rows(X, y, devices):
    raise NotImplementedError('write this function, then run its check')

def split_batch(X, y, devices):
    {body}
"""
    result = grade_source(exercise, source, only={"book_demo_gives_rows_0_1_and_2_3"})
    (verdict,) = [c for c in result.checks if c.name == "book_demo_gives_rows_0_1_and_2_3"]
    assert not verdict.passed and said in verdict.message, verdict.message


# Right code that takes another route than the reference: each gets full marks, because the
# checks judge what the code does, not how it gets there.
OTHER_ROUTES = {
    "allreduce": """
def allreduce(data):
    total = sum(t.to(data[0].device) for t in data)
    for t in data:
        t.copy_(total)
""",
    "get_params": """
def get_params(params, device):
    return [nn.Parameter(p.detach().to(device).clone()) for p in params]
""",
    "split_batch": """
def split_batch(X, y, devices):
    if len(X) != len(y):
        raise ValueError(f'{len(X)} examples but {len(y)} labels')
    sizes = [len(c) for c in torch.arange(len(X)).chunk(len(devices))]
    return ([x.to(d) for x, d in zip(torch.split(X, sizes), devices)],
            [t.to(d) for t, d in zip(torch.split(y, sizes), devices)])
""",
    "train_batch": """
def train_batch(X, y, device_params, devices, lr):
    for params in device_params:  # PyTorch's habit: clear the gradients before backward
        for p in params:
            p.grad = None
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, params in zip(X_shards, y_shards, device_params):
        loss(lenet(X_shard, params), y_shard).sum().backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([params[i].grad for params in device_params])
        for params in device_params:
            for p in params:
                p -= lr * p.grad / X.shape[0]
""",
    "resnet18": """
import torchvision

def resnet18(num_classes, in_channels=1):  # torchvision's blocks, under the book's names
    tv = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    net = nn.Sequential(nn.Conv2d(in_channels, 64, kernel_size=3, padding=1, bias=False),
                        tv.bn1, tv.relu, nn.Identity())
    for i in range(1, 5):
        net.add_module(f'resnet_block{i}', getattr(tv, f'layer{i}'))
    net.add_module('global_avg_pool', tv.avgpool)
    net.add_module('fc', nn.Sequential(nn.Flatten(), tv.fc))
    return net
""",
    # the book's concise train, wrapped first and then moved, as PyTorch's tutorial does
    "train_dataparallel": variant(
        train_dataparallel.BOOK, train_dataparallel.RIGHT, MOVED="net"
    ).replace("device_ids=devices)", "device_ids=devices).to(devices[0])"),
}


@pytest.mark.parametrize("exercise_id", sorted(OTHER_ROUTES))
def test_right_code_by_another_route_gets_full_marks(exercise_id):
    exercise = load_manifest().exercise(exercise_id)
    result = grade_source(exercise, OTHER_ROUTES[exercise_id])
    failed = {c.name: c.message for c in result.checks if not c.passed}
    assert result.score == result.max_score, failed


# Code that does not do the work: a body that does nothing, or writes nonsense. A check may
# keep its points for a cause another check charges only where the code shows that slip, and
# a side property is judged only on results the code made, so none of these earns a point.
NO_WORK = {
    "try_gpu": "def try_gpu(i=0):\n    return None",
    "try_all_gpus": "def try_all_gpus():\n    return None",
    "get_params": "def get_params(params, device):\n    pass",
    "allreduce": "def allreduce(data):\n    for t in data:\n        t[:] = float('nan')",
    "split_batch": "def split_batch(X, y, devices):\n    pass",
    "train_batch": "def train_batch(X, y, device_params, devices, lr):\n    pass",
    "train_loop": "def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):\n"
    "    pass",
    "resnet18": "def resnet18(num_classes, in_channels=1):\n    return None",
    "train_dataparallel": "def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, "
    "devices=None):\n    pass",
}


@pytest.mark.parametrize("exercise_id", sorted(NO_WORK))
def test_code_that_does_not_do_the_work_earns_nothing(exercise_id):
    result = grade_source(load_manifest().exercise(exercise_id), NO_WORK[exercise_id])
    assert result.score == 0, [c.name for c in result.checks if c.passed]
