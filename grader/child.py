"""The grading child: load a submission's notebooks and run the cases of each exercise.

Run as `python -m grader.child REQUEST.json` in a scratch folder. It writes one
`<exercise>.pt` file of outcomes as each exercise finishes, so that whatever happens to
it later (a crash, a time limit), the exercises already run keep their results. It never
judges anything: the grader's own process does that from these files.
"""

import json
import sys
from pathlib import Path

import torch

from grader.api import Context, Student
from grader.loader import NotebookError, load_notebook
from grader.manifest import load_manifest
from grader.registry import exercise_checks
from grader.runner import run_checks


def main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    out = Path(request["out"])
    manifest = load_manifest()
    from dplab.devices import lab_devices

    ctx = Context(seed=int(request["seed"]), devices=lab_devices(int(request["devices"])))
    loaded: dict[str, object] = {}
    notes: dict[str, list[str]] = {}
    for name, path in request["notebooks"].items():
        try:
            result = load_notebook(
                Path(path), manifest.training_functions, module_name=f"submission_{Path(name).stem}"
            )
            loaded[name] = result.namespace
            notes[name] = result.notes
        except NotebookError as error:
            loaded[name] = error
            notes[name] = [str(error)]
    (out / "notes.json").write_text(json.dumps(notes))
    for exercise_id in request["exercises"]:
        ex = manifest.exercise(exercise_id)
        namespace = loaded.get(ex.notebook)
        if isinstance(namespace, NotebookError) or namespace is None:
            continue
        checks = exercise_checks(ex, include_hidden=bool(request["hidden"]))
        student = Student(namespace, ex.function, ex.notebook)
        outcomes = run_checks(checks, student, ctx)
        tmp = out / f".{exercise_id}.pt"
        torch.save(outcomes, tmp)
        tmp.replace(out / f"{exercise_id}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
