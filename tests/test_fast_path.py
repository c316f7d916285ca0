"""The fast path changes no verdict: the same classes graded with it (the default) and without it
(GRADER_FAST=off: children started afresh, no warm server, no helper children, no extra child
on idle cores) get the same verdict and points on every check.

The classes: the whole mistake catalogue (the k-th catalogued mistake of every exercise in
student k's notebooks, the reference everywhere else), the hostile class of
tests/test_hostile.py, and the seed notes moved into the notebooks (tests/test_seeds.py),
where they are here."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from grader.exercises.catalogue import mistakes_of
from grader.manifest import exercises_dir, load_manifest
from grader.tools.authoring import filled_in, reference_answers
from tests.conftest import python

pytestmark = pytest.mark.slow
MANIFEST = load_manifest()


def write_catalogue_class(root: Path) -> int:
    """Write one student per round of the catalogue; return how many."""
    catalogue = {ex.id: list(mistakes_of(ex).values()) for ex in MANIFEST.exercises}
    rounds = max(map(len, catalogue.values()))
    for k in range(rounds):
        folder = root / f"catalogue{k + 1:02d}" / MANIFEST.assignment
        folder.mkdir(parents=True)
        for notebook in MANIFEST.notebooks:
            answers = reference_answers(notebook)
            for ex in MANIFEST.in_notebook(notebook):
                if k < len(catalogue[ex.id]):
                    answers[f"{ex.id}-solution"] = catalogue[ex.id][k].source
            nb = filled_in(exercises_dir() / notebook, answers)
            (folder / notebook).write_text(json.dumps(nb), encoding="utf-8")
    return rounds


def grade_both_ways(root: Path) -> tuple[dict, dict]:
    """Grade the class under `root` with the fast path and without; return both reports'
    verdicts, check by check: {student: {(exercise, check): (passed, points)}}."""
    reports = []
    for fast in ("on", "off"):
        out = root.parent / f"report-{fast}.json"
        env = dict(os.environ, GRADER_FAST=fast)
        began = time.monotonic()
        done = subprocess.run(
            [python(), "-m", "grader", "grade", str(root), "--jobs", "2", "--json", str(out)],
            capture_output=True, text=True, timeout=3600, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        print(f"GRADER_FAST={fast}: {time.monotonic() - began:.0f} s")
        reports.append(verdicts(out))
    return reports[0], reports[1]


def verdicts(report: Path) -> dict[str, dict[tuple[str, str], tuple[bool, float]]]:
    return {
        s["id"]: {
            (e["name"], c["name"]): (c["passed"], c["points"])
            for e in s["exercises"]
            for c in e["checks"]
        }
        for s in json.loads(report.read_text())["submissions"]
    }


def differences(fast: dict, plain: dict) -> list[str]:
    """Every check whose verdict or points differ, said in a line."""
    said = [f"{s}: graded one way only" for s in sorted(set(fast) ^ set(plain))]
    for student in sorted(set(fast) & set(plain)):
        for key in sorted(set(fast[student]) | set(plain[student])):
            one, other = fast[student].get(key), plain[student].get(key)
            if one != other:
                said.append(f"{student} {key[0]}/{key[1]}: fast {one}, plain {other}")
    return said


def test_the_catalogue_and_the_hostile_class_get_the_same_verdicts_both_ways(tmp_path):
    from tests.test_hostile import Server, build_class

    root = tmp_path / "class"
    rounds = write_catalogue_class(root)
    server = Server()
    try:
        hostile = build_class(root, server.port, [tmp_path / "results.json"])
        fast, plain = grade_both_ways(root)
    finally:
        server.close()
    assert len(fast) == rounds + len(hostile), sorted(fast)  # (so that an empty class fails)
    assert sum(not passed for checks in fast.values() for passed, _ in checks.values()) > 100
    assert not differences(fast, plain), "\n".join(differences(fast, plain))


def test_the_seeds_get_the_same_verdicts_both_ways(tmp_path):
    from tests.test_seeds import SEEDS, write_seed_class

    if not SEEDS.is_dir():
        pytest.skip(f"the seed notes are not here ({SEEDS})")
    root = tmp_path / "class"
    write_seed_class(root)
    fast, plain = grade_both_ways(root)
    assert fast and not differences(fast, plain), "\n".join(differences(fast, plain))
