"""The catalogue of known mistakes: each is caught by the right check, with the right hint."""

import importlib

import pytest

from grader.manifest import load_manifest
from grader.mistakes import mistakes_of, variant
from tests.conftest import fresh_solution, grade_in_process, grade_source

CATALOGUE = [
    pytest.param(ex, name, mistake, id=f"{ex.id}::{name}", marks=getattr(pytest.mark, ex.id))
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


@pytest.mark.parametrize(("exercise", "name", "mistake"), CATALOGUE)
def test_mistake_is_caught_with_its_hint(exercise, name, mistake):
    """Graded on the check that should catch it (and those it comes after) alone, so that only
    their cases run. Whole exercises are graded with catalogued mistakes in
    tests/test_nbgrader.py (the first notebook's) and in `make bench-grade` (all of them)."""
    result = grade_source(exercise, mistake.source, only={mistake.fails})
    verdicts = {c.name: c for c in result.checks}
    assert mistake.fails in verdicts, f"{mistake.fails} is not a check of {exercise.id}"
    verdict = verdicts[mistake.fails]
    assert not verdict.passed, f"{name} passed {mistake.fails}"
    assert mistake.hint_mentions in verdict.hint, (
        f"{name} failed {mistake.fails} with the hint {verdict.hint!r}, "
        f"expected it to mention {mistake.hint_mentions!r}"
    )
    assert result.score < result.max_score


NEVER = [p for p in CATALOGUE if p.values[2].hints_never]


@pytest.mark.parametrize(("exercise", "name", "mistake"), NEVER)
def test_no_hint_names_a_mistake_that_was_not_made(exercise, name, mistake):
    """Graded on every check of its exercise, no failed check hints at a mistake the code
    does not make (a hint is tied to what the check saw, not to the check)."""
    result = grade_source(exercise, mistake.source)
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
