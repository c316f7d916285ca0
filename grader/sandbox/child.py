"""The grading child: load a submission's notebooks and run the cases the grader asks for.

Started by the fork server (grader.sandbox.forkserver) or as `python -m grader.sandbox.child
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
stop when the exercise ends (grader.ranks.reference_in_ranks).
"""

import builtins
import contextlib
import itertools
import os
import sys
import time
from pathlib import Path
from types import FunctionType, ModuleType

import torch

from grader.api import Case, Context, Student
from grader.load.notebook import NotebookError, load_cells, load_notebook
from grader.manifest import load_manifest
from grader.ranks import rank_pools, reference_in_ranks, starts_processes
from grader.sandbox.fence import install_audit_hook
from grader.sandbox.frames import Channel, read_reply
from grader.sandbox.runner import run_case


def public_modules() -> set[str]:
    """Return the modules a case may come from: the manifest's public checks modules and
    the fixtures they share (never a hidden check or a mistake)."""
    return {ex.checks for ex in load_manifest().exercises} | {"grader.fixtures"}


def held_cells(channel: Channel, reply_fd: int, nonce: str, exercise: str, names) -> list[str]:
    """Ask the grader for the reference cells that `names` need (none: an empty list)."""
    channel.send("held", exercise=exercise, names=sorted(names))
    return [str(c) for c in read_reply(reply_fd, nonce).get("cells") or []]


def run_reference_cells(cells: list[str]) -> dict:
    """Run the reference's `cells` (see held_cells); return the names they define."""
    loaded = load_cells(cells, Path("reference"), module_name="held", label="reference cell")
    return loaded.namespace


def claimed(channel: Channel, reply_fd: int, nonce: str, exercise: str, case: str) -> bool:
    """Ask the grader whether this child may run a case (no other child has taken it)."""
    channel.send("claim", exercise=exercise, case=case)
    return bool(read_reply(reply_fd, nonce).get("go"))


def resolve_case(origin: list[str]) -> Case:
    """Return the public case function named by the grader, refusing anything else."""
    module_name, attribute = origin
    if module_name not in public_modules():
        raise ValueError(f"{module_name} is not a public checks module")
    module = __import__(module_name, fromlist=[attribute])
    found = getattr(module, attribute)
    if not isinstance(found, Case):
        raise ValueError(f"{module_name}.{attribute} is not a case")
    return found


# The torch names whose change would change what the child observes. Comparisons such as
# torch.equal are not among them: the child compares nothing, the grader does. Nor is all of
# torch: it rebinds some of its own names when parts load lazily.
TORCH_FUNCTIONS = ("device", "save")


def watched_objects() -> dict[str, object]:
    """Return what the cases rely on: the grader's modules, unittest.mock, tensors, modules,
    torch.distributed and builtins."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    watched: dict[str, object] = {
        "builtins": builtins,
        "torch.Tensor": torch.Tensor,
        "torch.nn.Module": torch.nn.Module,
        "torch.distributed": dist,  # the distributed checks record its calls and trust it
        "torch.distributed.distributed_c10d": distributed_c10d,
        "dplab.distributed": sys.modules["dplab.distributed"],  # starts the ranks
    }
    for name, module in list(sys.modules.items()):
        ours = name == "grader" or name.startswith("grader.")
        if (ours or name == "unittest.mock") and isinstance(module, ModuleType):
            watched[name] = module  # unittest.mock: the cases swap names with it
    return watched


# torch keeps answers it works out lazily in plain module variables (torch.distributed's
# `_spmd_types_available` is set when torch._dynamo is first imported, which the first
# optimizer or launch does): in torch's modules only functions, classes and objects count.
PLAIN = (type(None), bool, int, float, str)


def _counted(name: str, obj: object) -> dict[str, object]:
    """Return the attributes of a watched object that count, by name (the type of each value
    is asked with type(), never isinstance: torch's deprecated `reduce_op` warns whenever its
    attributes are looked up)."""
    attributes = vars(obj)
    if name.startswith("torch.") and isinstance(obj, ModuleType):
        return {k: v for k, v in attributes.items() if not issubclass(type(v), PLAIN)}
    return dict(attributes)


class Snapshot:
    """What the watched objects (and torch's TORCH_FUNCTIONS) point to now, the objects
    themselves held; `changed()` names those that point elsewhere since (or are gone), by
    identity. Cheap: a grade takes one in every rank after every run."""

    def __init__(self, watched: dict[str, object]) -> None:
        self.watched = watched
        self.torch = {name: getattr(torch, name) for name in TORCH_FUNCTIONS}
        self.held = {name: _counted(name, obj) for name, obj in watched.items()}
        self.code = [
            (name, attribute, value, value.__code__)
            for name, attributes in self.held.items()
            for attribute, value in attributes.items()
            if type(value) is FunctionType
        ]

    def changes(self) -> dict[str, int]:
        """Return, for each name that points elsewhere now, the identity of what it points to
        (of its function body, for a function whose body was swapped)."""
        missing = object()
        found = {}
        for name, value in self.torch.items():
            now = getattr(torch, name, missing)
            if now is not value:
                found[f"torch.{name}"] = id(now)
        for name, attributes in self.held.items():
            namespace = vars(self.watched[name])
            for attribute, value in attributes.items():
                now = namespace.get(attribute, missing)
                if now is not value:
                    found[f"{name}.{attribute}"] = id(now)
        for name, attribute, function, code in self.code:
            if function.__code__ is not code:
                found.setdefault(f"{name}.{attribute}", id(function.__code__))
        return found

    def changed(self) -> list[str]:
        """Return the names that point elsewhere now (or are gone), sorted."""
        return sorted(self.changes())


def load(
    notebook: str, request: dict, channel: Channel, limit: float | None
) -> dict | NotebookError:
    """Load a notebook of the submission, reporting each statement; return its namespace, or
    the error that kept it from loading."""
    manifest = load_manifest()
    channel.send("loading", notebook=notebook)
    try:
        skip = frozenset(tuple(s) for s in request["skip"].get(notebook, []))
        started = time.perf_counter()
        result = load_notebook(
            Path(request["notebooks"][notebook]),
            manifest.training_functions,
            module_name=f"submission_{Path(notebook).stem}",
            statement_seconds=limit,
            skip_statements=skip,
            before_statement=lambda cell, line: channel.send(
                "statement", notebook=notebook, cell=cell, line=line
            ),
        )
    except NotebookError as error:
        channel.send("loaded", notebook=notebook, notes=[str(error)], failed=True)
        return error
    channel.send(
        "loaded", notebook=notebook, notes=result.notes, seconds=time.perf_counter() - started
    )
    return result.namespace


def main(request_path: str, report_fd: int | None = None, reply_fd: int | None = None) -> None:
    """Run the request at `request_path`; the pipes' descriptors are in it unless given."""
    request = torch.load(request_path, weights_only=True)
    os.remove(request_path)
    threads = max(1, int(request["threads"]))
    torch.set_num_threads(threads)
    nonce = str(request["nonce"])
    channel = Channel(int(request["fd"] if report_fd is None else report_fd), nonce)
    reply_fd = int(request["reply_fd"] if reply_fd is None else reply_fd)
    manifest = load_manifest()
    from dplab.devices import grading_devices

    ctx = Context(seed=int(request["seed"]), devices=grading_devices(int(request["devices"])))
    plans = {
        ex: [(name, resolve_case(origin), args) for name, origin, args in cases]
        for ex, cases in request["exercises"]
    }
    if "torch._dynamo" not in sys.modules and any(
        starts_processes(manifest.exercise(ex)) for ex in plans
    ):
        # A child started afresh imports now what a forked one has from the fork server's
        # session (forkserver.the_rest): otherwise each of its ranks would import it.
        from grader.sandbox.forkserver import the_rest

        for step in the_rest():
            step()
    before = Snapshot(watched_objects())
    install_audit_hook(Path(request["scratch"]), [Path(p) for p in request["private"]])
    limit = float(request["check_seconds"]) or None  # processor time per thread
    loaded: dict[str, dict | NotebookError] = {}
    with contextlib.ExitStack() as pools:
        for exercise_id, plan in plans.items():
            ex = manifest.exercise(exercise_id)
            if not plan:  # every case already ran in an earlier child
                channel.send("exercise-done", exercise=exercise_id, changed=[])
                continue
            # Each case is claimed just before it runs: while cores sit idle, another child may
            # be running the notebook's cases from the far end (grader.sandbox.supervisor).
            mine = (c for c in plan if claimed(channel, reply_fd, nonce, exercise_id, c[0]))
            first = next(mine, None)
            if first is None:
                continue  # another child has taken them all
            channel.send("exercise-start", exercise=exercise_id)
            if ex.notebook not in loaded:
                loaded[ex.notebook] = load(ex.notebook, request, channel, limit)
                if not isinstance(loaded[ex.notebook], NotebookError):
                    # The notebook's distributed exercises share their ranks (grader.ranks).
                    pools.enter_context(rank_pools(loaded[ex.notebook], ex.notebook))
            namespace = loaded[ex.notebook]
            if isinstance(namespace, NotebookError):
                channel.send(
                    "exercise-done",
                    exercise=exercise_id,
                    changed=[],
                    unloadable=f"{ex.notebook} could not be loaded: {namespace}",
                )
                continue
            student = Student(namespace, ex.function, ex.notebook)
            holds = {n for _, found, _ in plan for n in found.holds}
            cells = held_cells(channel, reply_fd, nonce, exercise_id, holds) if holds else []
            held = run_reference_cells(cells) if cells else None
            # Ranks that have seen a reference serve only the exercise that holds it.
            in_ranks = reference_in_ranks(cells, held, holds) if held is not None else None
            with in_ranks or contextlib.nullcontext():
                for name, found, args in itertools.chain([first], mine):
                    channel.send("case-start", exercise=exercise_id, case=name)
                    outcome = run_case(found.using(name), student, ctx, args, limit, held)
                    channel.send("case", exercise=exercise_id, case=name, outcome=outcome)
            del held
            changed = before.changed()
            channel.send("exercise-done", exercise=exercise_id, changed=changed)


if __name__ == "__main__":
    main(sys.argv[1])
