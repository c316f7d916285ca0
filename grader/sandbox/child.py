"""The grading child: load a submission's notebooks and run the cases the grader asks for.

Started by the fork server (grader.sandbox.fast.forkserver) or as `python -m grader.sandbox.child
REQUEST`, inside the fence (grader.sandbox.fence). It reads the request (then deletes it),
arms the audit hook, and only then touches the student's code.
It reports on a pipe, one frame at a time, so that the grader knows what was running if the
child dies: `exercise-start`, `loading`, `loaded`, `claim`, `case-start`, `case`,
`exercise-done`. It claims each case just before it runs it, and runs it only if the grader
says go: while cores sit idle, another child may be running the notebook's cases from the far
end.
It never judges: the grader's own process does that from these frames.

An exercise whose cases hold names right (see grader.load.reference) asks for them with a `held`
frame once it has started, and reads the reference's cells from a second pipe. The grader
answers only for the exercise the child is on, so that no reference is in this process
before the exercises it holds have been judged. The notebook's ranks run those cells too, and
stop when the exercise ends (grader.ranks.pools.reference_in_ranks).
"""

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

import labtext
from dplab.processes import end_with_parent
from grader.api import Case, Context, Student
from grader.base.protocol import (
    CaseDone,
    CaseStart,
    ChildRequest,
    Claim,
    ExerciseDone,
    ExerciseStart,
    Held,
    Loading,
    Note,
    NotebookLoaded,
    Statement,
    request_from_plain,
)
from grader.base.tampering import Snapshot, watched_objects
from grader.load.notebook import NotebookError, load_cells, load_notebook
from grader.load.runner import run_case
from grader.manifest import Exercise, load_manifest
from grader.ranks.pools import rank_pools, reference_in_ranks
from grader.sandbox.audit import install_audit_hook
from grader.sandbox.frames import Channel, read_reply
from labtext import _


def public_modules() -> set[str]:
    """Return the modules a case may come from: the manifest's public checks modules and
    the fixtures they share (never a hidden check or a mistake)."""
    return {ex.checks for ex in load_manifest().exercises} | {"grader.base.inputs"}


def _dynamo() -> None:
    import torch._dynamo  # noqa: F401  (every torch.optim optimizer imports it: 0.45 s)


def _plotting() -> None:
    import matplotlib  # (0.2 s: a notebook that imports pyplot imports it whole)

    matplotlib.use("Agg")


# What a child imports before it forks ranks for a distributed exercise, so that its ranks
# share it rather than each importing it; last first (grader.sandbox.fast.preload.the_rest).
LATER_IMPORTS = (_dynamo, _plotting)


def held_cells(channel: Channel, reply_fd: int, nonce: str, exercise: str, names) -> list[str]:
    """Ask the grader for the reference cells that `names` need (none: an empty list)."""
    channel.send(Held(exercise, sorted(names)))
    return list(read_reply(reply_fd, nonce).cells or [])


def run_reference_cells(cells: list[str]) -> dict:
    """Run the reference's `cells` (see held_cells); return the names they define."""
    loaded = load_cells(cells, Path("reference"), module_name="held", kind="reference")
    return loaded.namespace


def claimed(channel: Channel, reply_fd: int, nonce: str, exercise: str, case: str) -> bool:
    """Ask the grader whether this child may run a case (no other child has taken it)."""
    channel.send(Claim(exercise, case))
    return read_reply(reply_fd, nonce).go


def resolve_case(origin: list[str]) -> Case:
    """Return the public case function named by the grader, refusing anything else."""
    module_name, attribute = origin
    if module_name not in public_modules():
        raise ValueError(_("{module} is not a public checks module").format(module=module_name))
    module = __import__(module_name, fromlist=[attribute])
    found = getattr(module, attribute)
    if not isinstance(found, Case):
        raise ValueError(
            _("{module}.{name} is not a case").format(module=module_name, name=attribute)
        )
    return found


def load(
    notebook: str, request: ChildRequest, channel: Channel, limit: float | None
) -> dict | NotebookError:
    """Load a notebook of the submission, reporting each statement; return its namespace, or
    the error that kept it from loading."""
    manifest = load_manifest()
    channel.send(Loading(notebook))
    try:
        skip = frozenset(tuple(s) for s in request.skip.get(notebook, []))
        started = time.perf_counter()
        result = load_notebook(
            Path(request.notebooks[notebook]),
            manifest.training_functions,
            module_name=f"submission_{Path(notebook).stem}",
            statement_seconds=limit,
            skip_statements=skip,
            before_statement=lambda cell, line: channel.send(Statement(notebook, cell, line)),
        )
    except NotebookError as error:
        channel.send(NotebookLoaded(notebook, [Note("unloadable", str(error))], failed=True))
        return error
    channel.send(NotebookLoaded(notebook, result.notes, seconds=time.perf_counter() - started))
    return result.namespace


def main(request_path: str, report_fd: int | None = None, reply_fd: int | None = None) -> None:
    """Run the request at `request_path`; the pipes' descriptors are in it unless given.
    What the child says (a missing function, a limit, a fence's refusal, what the cases
    raise) is said in the request's language, the submission's: the grader's process judges
    under the same language (grader.grading), and passes through `_()` what is English."""
    request = request_from_plain(torch.load(request_path, weights_only=True))
    os.remove(request_path)
    language = labtext.known(request.language) or "en"
    if language != "en":
        labtext.catalogue(language)  # read now: the audit hook fences files later
    with labtext.speaking(language):
        run_request(request, report_fd, reply_fd)


Planned = tuple[str, Case, dict]  # a case to run: its name, its function, its arguments


def run_request(request: ChildRequest, report_fd: int | None, reply_fd: int | None) -> None:
    """Run a request read by `main`."""
    torch.set_num_threads(max(1, request.threads))
    nonce = request.nonce
    channel = Channel(request.fd if report_fd is None else report_fd, nonce)
    reply_fd = request.reply_fd if reply_fd is None else reply_fd
    manifest = load_manifest()
    from grader.base.grading_devices import grading_devices

    # Notes for whoever runs the command (the stand-in devices') are in the command's language.
    labtext.choose(labtext.known(request.terminal))
    ctx = Context(seed=request.seed, devices=grading_devices(request.devices))
    plans = {
        ex: [(name, resolve_case(origin), args) for name, origin, args in cases]
        for ex, cases in request.exercises
    }
    if "torch._dynamo" not in sys.modules and any(
        manifest.exercise(ex).distributed for ex in plans
    ):
        # Imported now, or else by each of its ranks (a forked child may have them already).
        for step in LATER_IMPORTS:
            step()
    before = Snapshot(watched_objects())
    install_audit_hook(Path(request.scratch), [Path(p) for p in request.private])
    limit = request.limits.check_seconds or None  # processor time per thread
    with contextlib.ExitStack() as pools:
        exercises = Exercises(request, channel, reply_fd, nonce, ctx, limit, before, pools)
        for exercise_id, plan in plans.items():
            exercises.run(exercise_id, manifest.exercise(exercise_id), plan)


class Exercises:
    """Runs a request's exercises one after another (see `run_request`): the notebooks loaded so far
    (with their ranks in `pools`), and what the exercises share."""

    def __init__(
        self,
        request: ChildRequest,
        channel: Channel,
        reply_fd: int,
        nonce: str,
        ctx: Context,
        limit: float | None,
        before: Snapshot,
        pools: contextlib.ExitStack,
    ) -> None:
        self.request, self.channel, self.reply_fd, self.nonce = request, channel, reply_fd, nonce
        self.ctx, self.limit, self.before, self.pools = ctx, limit, before, pools
        self.loaded: dict[str, dict | NotebookError] = {}

    def run(self, exercise_id: str, ex: Exercise, plan: list[Planned]) -> None:
        """Run the cases of `plan` that this child claims for the exercise, and report."""
        if not plan:  # every case already ran in an earlier child
            self.channel.send(ExerciseDone(exercise_id))
            return
        # Where asked to, each case is claimed just before it runs: another loop of children
        # may be running the notebook's cases from the far end (grader.sandbox.fast.sharing).
        mine = (
            c
            for c in plan
            if not self.request.asks
            or claimed(self.channel, self.reply_fd, self.nonce, exercise_id, c[0])
        )
        first = next(mine, None)
        if first is None:
            return  # another child has taken them all
        self.channel.send(ExerciseStart(exercise_id))
        namespace = self.notebook(ex.notebook)
        if isinstance(namespace, NotebookError):
            unloadable = _("{notebook} could not be loaded: {notes}").format(
                notebook=ex.notebook, notes=namespace
            )
            self.channel.send(ExerciseDone(exercise_id, unloadable=unloadable))
            return
        student = Student(namespace, ex.function, ex.notebook, self.request.limits)
        self.run_cases(exercise_id, student, plan, itertools.chain([first], mine))
        changed = self.before.changed()
        self.channel.send(ExerciseDone(exercise_id, changed))

    def notebook(self, notebook: str) -> dict | NotebookError:
        """Return the namespace of `notebook`, loading it the first time (or the error that
        kept it from loading)."""
        if notebook not in self.loaded:
            self.loaded[notebook] = load(notebook, self.request, self.channel, self.limit)
            if not isinstance(self.loaded[notebook], NotebookError):
                # The notebook's distributed exercises share their ranks (grader.ranks).
                self.pools.enter_context(
                    rank_pools(self.loaded[notebook], notebook, run_reference_cells)
                )
        return self.loaded[notebook]

    def run_cases(
        self, exercise_id: str, student: Student, plan: list[Planned], mine: Iterator[Planned]
    ) -> None:
        """Run the cases `mine` (those claimed of `plan`), with the reference's cells that
        they hold names right with; what those define goes when this returns."""
        holds = {n for _, found, _ in plan for n in found.holds}
        cells = (
            held_cells(self.channel, self.reply_fd, self.nonce, exercise_id, holds) if holds else []
        )
        held = run_reference_cells(cells) if cells else None
        # Ranks that have seen a reference serve only the exercise that holds it.
        in_ranks = reference_in_ranks(cells, held, holds) if held is not None else None
        with in_ranks or contextlib.nullcontext():
            for name, found, args in mine:
                self.channel.send(CaseStart(exercise_id, name))
                outcome = run_case(found.using(name), student, self.ctx, args, self.limit, held)
                self.channel.send(CaseDone(exercise_id, name, outcome))


if __name__ == "__main__":  # started afresh: python -m grader.sandbox.child REQUEST GRADER_PID
    # No fork server stops a child started afresh: it ends with the grader, even one killed
    # by `kill -9` or for memory (its ranks end with it: dplab.rank.fork_rank).
    end_with_parent(int(sys.argv[2]))
    main(sys.argv[1])
