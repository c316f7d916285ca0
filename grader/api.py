"""The vocabulary of a checks module: cases, checks, failures, comparisons, fixtures and
process groups. A checks module imports from here and nowhere else of the grader.

How to add a check
------------------
1. In `grader/exercises/<exercise>/checks.py`, write a *case*: a
   function of (student, ctx, **params) that calls the student's code and returns what it
   saw. It runs in the grading child, next to the student's code. Call the function the
   exercise asks for as `student.fn`; swap another of the student's names for the case's
   length with `with student.replaced(lenet=recorder): ...`, and a library's name with
   `unittest.mock.patch.object`. Use `ctx.devices`.
   Inputs come one way: as the case's parameters (see `using` below), and whatever is
   random, from a function of the case's seed, `ctx.seed`, such as `float_lists(ctx.seed)`
   (`seeded(ctx.seed)` is a generator started from it). The check calls the
   same function to know what went in.
   A case whose code must run in every process of a group (the distributed exercises)
   hands a function to `in_every_size`, and records the group's calls with
   `recording_calls`; its check walks the ranks with `every_rank`.
2. Write a *check*: a function of (seen, ctx) that returns when the property holds and
   raises `Fail` (through `expect`, `expect_equal`, `expect_close`) when it does not. It
   runs in the grader's own process. Give it points and a hint that says what the property
   needs: it is shown with any failure the check finds. A hint that names one mistake (a
   rebinding, a dtype changed) goes with the failure that saw its evidence, as
   `Fail(message, hint)`; where every call raised, only a hint about the error is shown.
3. Run `python -m grader sync` (the check cell's points become the exercise's: the sum of
   its checks') and `make exercises`.

    @case
    def book_demo(student, ctx):
        data = [torch.ones((1, 2), device=ctx.devices[i]) * (i + 1) for i in range(2)]
        student.fn(data)
        return data

    @check_on(book_demo, points=2, hint="Add every other tensor into data[0], then copy it back.")
    def both_devices_hold_threes(seen, ctx):
        for t in seen:
            expect_equal(t, torch.tensor([[3.0, 3.0]]), "each tensor after allreduce")

A variant of a case, with other inputs, is `book_demo.using("name", "what it does", n=4)`:
its parameters are values, or functions of ctx that the grader computes from the case's seed.
Hidden checks (`grader/exercises/<exercise>/private/hidden.py`) use public cases this way, so
that their inputs stay on the instructor's side. `@error_hints` declares a function that turns
an error the student's code raised into a hint naming the mistake.

One mistake should cost the checks about it, and no others:
- a case that records what the student's code does on the way (a training loop) calls it
  through `attempt`, so that a crash at the end still leaves what happened before it to
  judge; a check that needs the call to have finished says so with `returned(...)`;
- a case that calls the student's function, which in turn calls the student's other
  functions, names those in `holds`: where the reference solution is at hand (the
  instructor's side) they are replaced by the reference's for the case, so that a wrong
  `allreduce` costs the checks of `allreduce`, not those of `train_batch` as well;
- a check judges the outcome the exercise asks for, on whatever part of the result shows
  it, whatever route the code took; where a result hides the property (copies that are
  not a list of tensors), it says so with `observe(condition, "other_check", because)`,
  and earns nothing and charges nothing;
- `after=` on a check names the checks that must pass first, and `because=` says why in one
  line: only where the property cannot be observed unless they pass (a test holds every
  gate to a reason);
- `Fail(..., see="other_check")` (or `expect(..., see=...)`) says that a failure has the
  cause another check judges: where that check fails too, this one keeps its points.

Messages are written in English and looked up in the reader's language (labtext):
`_("got {got}").format(got=...)` where a message is made, `N_(...)` for a constant. A check's
docstring and hint, and the hints and messages given to `Fail`, are looked up by the judge.
"""

import importlib
from typing import TYPE_CHECKING, Any

from grader.base.cases import Case, Check, Context, ErrorHints, Student, case, check_on, error_hints
from grader.base.expect import (
    close,
    expect,
    expect_close,
    expect_equal,
    expect_kept_dtype,
    short,
    tensor_in,
)
from grader.base.forward_pass import LAYER_KINDS, recorded_forward
from grader.base.inputs import (
    SGD_SETTINGS,
    FirstBatches,
    MarkedSteps,
    RecordedBatches,
    RunLog,
    batch_name,
    cycle,
    lenet_loss,
    mark_of,
    pretend_gpus,
    quiet_animator,
    quiet_plots,
    random_batch,
    sample_images,
    seeded,
    sgd_step,
    sgd_update,
    state,
    which_replica,
)
from grader.base.outcomes import (
    Attempt,
    Crash,
    Fail,
    MissingFunction,
    Raised,
    Stopped,
    Stub,
    Unobserved,
    all_finished,
    attempt,
    charged_by,
    finished,
    is_stub,
    observe,
    raised_in,
    returned,
)
from grader.base.values import SeenTensor
from grader.ranks.judging import (
    GroupSeen,
    RankSeen,
    every_group,
    every_rank,
    groups_finished,
    ranks_that_returned,
)
from labtext import N_, _

# The tools that start process groups, imported when a checks module first asks for one
# (PEP 562): a student's kernel checking a one-process exercise loads none of them, nor the
# launcher below them (tests/test_layers.py counts what it loads).
_RANK_TOOLS = {
    "apart": "grader.ranks.apart",
    "in_every_size": "grader.ranks.groups",
    "in_rank": "grader.ranks.groups",
    "COLLECTIVES": "grader.ranks.recording",
    "all_reduce": "grader.ranks.recording",
    "recording_calls": "grader.ranks.recording",
}


if TYPE_CHECKING:  # (what readers and type checkers see: at run time, `__getattr__`)
    from grader.ranks.apart import apart
    from grader.ranks.groups import in_every_size, in_rank
    from grader.ranks.recording import COLLECTIVES, all_reduce, recording_calls


def __getattr__(name: str) -> Any:
    if name not in _RANK_TOOLS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_RANK_TOOLS[name]), name)
    globals()[name] = value
    return value


__all__ = [
    # declaring cases and checks
    "Case",
    "Check",
    "Context",
    "ErrorHints",
    "Student",
    "case",
    "check_on",
    "error_hints",
    # what a case saw, and failing
    "Crash",
    "Fail",
    "MissingFunction",
    "Raised",
    "SeenTensor",
    "Stub",
    "Stopped",
    "Unobserved",
    "all_finished",
    "Attempt",
    "attempt",
    "charged_by",
    "finished",
    "is_stub",
    "observe",
    "raised_in",
    "returned",
    # comparisons
    "tensor_in",
    "close",
    "expect",
    "expect_close",
    "expect_equal",
    "expect_kept_dtype",
    "short",
    # what a network computes, from a forward pass
    "LAYER_KINDS",
    "recorded_forward",
    # messages in the reader's language (labtext)
    "_",
    "N_",
    # inputs and stand-ins the exercises share
    "FirstBatches",
    "MarkedSteps",
    "RecordedBatches",
    "RunLog",
    "SGD_SETTINGS",
    "batch_name",
    "cycle",
    "lenet_loss",
    "mark_of",
    "pretend_gpus",
    "quiet_animator",
    "quiet_plots",
    "random_batch",
    "sample_images",
    "seeded",
    "sgd_step",
    "sgd_update",
    "state",
    "which_replica",
    # process groups (the distributed notebook)
    "COLLECTIVES",
    "all_reduce",
    "apart",
    "GroupSeen",
    "RankSeen",
    "every_group",
    "every_rank",
    "groups_finished",
    "in_every_size",
    "in_rank",
    "ranks_that_returned",
    "recording_calls",
]
