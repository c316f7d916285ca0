"""Run Gradescope's autograder on the reference submission N times under half a CPU, as
`make images` does once (tests/test_images.py::test_gradescope_grades_within_its_limits_as_grade_does),
and keep each run's verdicts.

    python -m tests.gradescope_half_cpu [--runs 20] [--out docs/runs/gradescope-half-cpu.json]

As the test: the zip of `gradescope-bundle` unpacked as Gradescope lays it out, its setup.sh run
once in a container of the base image (`docker/check base`), then, for each run, student01 of
grader.benchmarks.grade.make_class (the reference solutions) handed in and `run_autograder` run under
`timeout 600` with `--cpus 0.5` and the memory of tests/test_images.py (3g, swap the same). Each run's results.json is
compared check by check with `python -m grader grade` of the same notebooks on this machine
(graded once, before the runs), and kept: total, each check's name, score and max_score, and
the first line of its output where it lost points. The container's cgroup is read as the
autograder ends: its peak memory, the processes the kernel killed for memory, and how often
the CPU quota throttled it. The JSON is rewritten after every run, so that a stopped series
keeps what it ran. Needs what `make images` needs (root with buildah and podman, or Docker).
"""

import argparse
import datetime
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from grader.benchmarks.grade import make_class
from tests.test_gradescope import graded, hand_in, unpacked, write_bundle
from tests.test_images import AUTOGRADER_SECONDS, GRADESCOPE_CPUS, GRADESCOPE_MEMORY, check, run

REPO = Path(__file__).resolve().parents[1]

# Run inside the container after run_autograder: its cgroup (v1 or v2) as it ends.
CGROUP = r"""
timeout {seconds} /autograder/source/run_autograder; code=$?
{{ echo "@@cgroup"
  for f in memory/memory.max_usage_in_bytes memory.peak memory/memory.oom_control memory.events \
           cpu/cpu.stat cpu.stat; do
    [ -r /sys/fs/cgroup/$f ] && sed "s|^|$f |" /sys/fs/cgroup/$f
  done; }} >&2
exit $code
"""


def cgroup_figures(stderr: str) -> dict:
    """Peak memory (MiB), kills for memory and CPU throttling, from CGROUP's lines."""
    found: dict[str, float] = {}
    for line in stderr.split("@@cgroup", 1)[-1].splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("memory/memory.max_usage_in_bytes", "memory.peak"):
            found["memory_peak_mib"] = round(int(parts[1]) / 2**20)
        elif len(parts) == 3 and parts[1] in ("oom_kill", "oom"):
            found[parts[1]] = int(parts[2])
        elif len(parts) == 3 and parts[1] in ("nr_periods", "nr_throttled", "throttled_time"):
            found[parts[1]] = int(parts[2])
    return found


def first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def one_run(number: int, base: str, root: Path, mine: Path, email: str, expected: dict) -> dict:
    hand_in(root, sorted(mine.glob("*.ipynb")), email)
    results_json = root / "results" / "results.json"
    results_json.unlink(missing_ok=True)
    began, when = time.monotonic(), datetime.datetime.now().isoformat(timespec="seconds")
    done = run(
        base, "bash", "-c", CGROUP.format(seconds=AUTOGRADER_SECONDS),
        options=("-v", f"{root}:/autograder", "--cpus", GRADESCOPE_CPUS,
                 "--memory", GRADESCOPE_MEMORY, "--memory-swap", GRADESCOPE_MEMORY),
        timeout=AUTOGRADER_SECONDS + 300, cwd=root.parent,  # podman's ./oom lands there
    )  # fmt: skip
    seconds = round(time.monotonic() - began, 1)
    entry = {"run": number, "started": when, "seconds": seconds, "exit_code": done.returncode}
    entry.update(cgroup_figures(done.stderr))
    try:
        results = json.loads(results_json.read_text())
    except (OSError, ValueError) as e:
        entry.update(score=None, error=str(e), tail=(done.stdout + done.stderr)[-3000:])
        return entry
    tests = []
    for t in results["tests"]:
        row = {"name": t["name"], "score": t["score"], "max_score": t["max_score"]}
        if t["score"] != t["max_score"] or expected.get(t["name"], (t["score"],))[0] != t["score"]:
            row["output"] = first_line(t.get("output", ""))
        tests.append(row)
    got = {t["name"]: (t["score"], t["max_score"]) for t in results["tests"]}
    entry.update(
        score=results["score"],
        max_score=sum(t["max_score"] for t in results["tests"]),
        same_as_grade=got == expected,
        lost=[t for t in tests if t["score"] != t["max_score"]],
        tests=tests,
    )
    if entry["lost"] or not entry["same_as_grade"] or done.returncode:
        entry["tail"] = (done.stdout + done.stderr)[-3000:]
        entry["results_output"] = (results.get("output") or "")[:3000]
    return entry


def compact(kept: dict) -> str:
    """The JSON kept, small: the checks named once (with their points, and grade's here), each
    run's scores in that order, and only the checks that lost points in full, with the first
    line of what they said. A run whose checks differ from the list keeps its tests whole."""
    runs = kept["runs"]
    listed = next((r["tests"] for r in runs if r.get("tests")), [])
    names = [t["name"] for t in listed]
    out = {k: v for k, v in kept.items() if k != "runs"}
    out["checks"] = [
        {
            "name": t["name"],
            "max_score": t["max_score"],
            "grade_here": kept["expected"][t["name"]][0],
        }
        for t in listed
    ]
    out.pop("expected", None)
    out["runs"] = []
    for r in runs:
        r = dict(r)
        tests = r.pop("tests", None)
        if tests is not None and [t["name"] for t in tests] == names:
            r["scores"] = [t["score"] for t in tests]
        elif tests is not None:
            r["tests"] = tests
        out["runs"].append(r)
    text = json.dumps(out, indent=1)
    text = re.sub(r"\[\s*([-0-9.,\s]*?)\s*\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    return re.sub(
        r"\{\n\s+(\"name\": [^{}\[\]]*?)\n\s+\}",
        lambda m: "{" + " ".join(line.strip() for line in m[1].splitlines()) + "}",
        text,
    )


def summary(runs: list[dict]) -> dict:
    seconds = [r["seconds"] for r in runs]
    return {
        "runs": len(runs),
        "totals": [r.get("score") for r in runs],
        "full_marks": sum(r.get("score") == r.get("max_score") for r in runs),
        "seconds_min_median_max": [min(seconds), statistics.median(seconds), max(seconds)]
        if seconds
        else [],
        "memory_peak_mib_max": max((r.get("memory_peak_mib", 0) for r in runs), default=0),
        "oom_kills": sum(r.get("oom_kill", 0) for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "docs/runs/gradescope-half-cpu.json")
    parser.add_argument("--student", default="student01")  # the reference solutions
    parser.add_argument("--note", default="")
    args = parser.parse_args()

    base = check("base").stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix="gradescope-half-cpu-"))
    try:
        root = unpacked(write_bundle(folder / "autograder.zip"), folder / "autograder")
        began = time.monotonic()
        setup = run(base, "bash", "/autograder/source/setup.sh",
                    options=("-v", f"{root}:/autograder"), timeout=1800)  # fmt: skip
        assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
        setup_seconds = round(time.monotonic() - began)
        print(f"setup.sh: {setup_seconds} s", flush=True)
        make_class(folder / "class", 3)
        email = f"{args.student}@example.org"
        mine = folder / email
        (folder / "class" / args.student / "multigpu").rename(mine)
        report = graded(mine)
        expected = {
            f"{e['name']}: {c['name']}": (c["points"], c["max_points"])
            for e in report["exercises"]
            for c in e["checks"]
        }
        print(f"grade on this machine: {report['score']:g}", flush=True)
        kept = {
            "what": "tests/test_images.py's half-CPU Gradescope run of the reference "
            f"({args.student}), repeated: python -m tests.gradescope_half_cpu --runs {args.runs}",
            "note": args.note,
            "limits": {"cpus": GRADESCOPE_CPUS, "memory": GRADESCOPE_MEMORY},
            "base_image": base,
            "setup_seconds": setup_seconds,
            "grade_here": report["score"],
            "fields": "checks: each check's name, points and grade's points here, in "
            "results.json's order; runs[].scores: that run's points in the same order; "
            "runs[].lost: the checks below full points, with the first line they said",
            "expected": {name: list(points) for name, points in expected.items()},
            "runs": [],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for number in range(1, args.runs + 1):
            entry = one_run(number, base, root, mine, email, expected)
            kept["runs"].append(entry)
            kept["summary"] = summary(kept["runs"])
            args.out.write_text(compact(kept) + "\n")
            lost = ", ".join(
                f"{t['name']} {t['score']}/{t['max_score']}" for t in entry.get("lost", [])
            )
            print(
                f"run {number}: {entry.get('score')}/{entry.get('max_score')} in "
                f"{entry['seconds']} s, peak {entry.get('memory_peak_mib')} MiB, "
                f"oom_kill {entry.get('oom_kill')}, throttled {entry.get('nr_throttled')}"
                + (f"; lost: {lost}" if lost else ""),
                flush=True,
            )
        print(json.dumps(kept["summary"]))
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)  # root's files from the container
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
