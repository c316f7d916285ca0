"""`make gpu-check`: everything that only a machine with an NVIDIA GPU can show, in one run.

    python -m grader.benchmarks.gpu_check [--json gpu-check.json] [--steps env,tests,class,book,ddp]

Each step runs in a Python of its own, with a time limit, and its result goes into the JSON
file the moment it is in, so a step that fails or runs out of time loses nothing else:

- env: the GPU, its driver, CUDA, PyTorch and NCCL, as they are;
- tests: the tests marked gpu or multigpu (tests/test_gpus.py, tests/test_outside_code.py,
  tests/test_device_corpus.py);
- class: `make bench-grade`'s class of 20 (reference solutions, untouched stubs, catalogued
  mistakes), graded by `python -m grader grade` with the GPU visible (children started
  afresh) and again with CUDA_VISIBLE_DEVICES empty; every check's verdict must agree, the
  references must get full marks and the stubs zero;
- book: the reference `train` of the from-scratch LeNet and of the concise ResNet-18 on one
  GPU, for the book's 10 epochs on the full Fashion-MNIST: seconds per epoch and test
  accuracy, against the book's V100 figures; then what bounds a ResNet-18 epoch;
- ddp: the distributed notebook's reference `train_ddp` under torchrun with NCCL, in one
  process and in two processes on the one GPU, and `make bench-distributed` with NCCL.

It ends with a table. It asserts nothing about speed: the figures are printed and kept.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.manifest import REPO

STEPS = ("env", "tests", "class", "book", "ddp")
LIMITS = {"env": 60, "tests": 560, "class": 400, "book": 300, "ddp": 260}


def run_timed(command: list[str], limit: float, env: dict | None = None) -> tuple[int, str, float]:
    """Run `command` in the repository, in a process group of its own; return its exit code,
    its output and its seconds. One that runs past `limit` seconds ends with its whole group,
    and its output ends with what every process was doing then (`ps`), so that a late step
    says where the time went."""
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=limit)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        seen = processes_now()
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code, out = 124, f"{out}{LATE}ran past {limit:g} s; the processes then:\n{seen}"
    return code, out, time.monotonic() - started


LATE = "\n---- late ----\n"  # between what a late command wrote and what ran when it was ended


def said_and_late(log: str) -> tuple[list[str], list[str]]:
    """Return the lines a command wrote and, if it ran late, the lines that say what ran."""
    said, _, late = log.partition(LATE)
    return said.strip().splitlines(), late.strip().splitlines()


def processes_now() -> str:
    """Return `ps`'s table of every process: state, CPU share, memory, threads, where each
    waits in the kernel, and its command line, the busiest first."""
    columns = "pid,ppid,stat,pcpu,rss,nlwp,wchan:22,etime,args"
    try:
        table = subprocess.run(
            ["ps", "-eo", columns, "--sort=-pcpu"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no ps: {e})"
    load = Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else ""
    rows = table.splitlines()
    user = [r for r in rows[1:] if not r.rstrip().endswith("]")]  # kernel threads left out
    return f"load {load}\n" + "\n".join(line[:220] for line in [*rows[:1], *user[:40]])


# ---- the steps, each run in a child: `python -m grader.benchmarks.gpu_check --step NAME` ----


def step_env() -> dict:
    import torch

    query = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        smi = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        smi = "no nvidia-smi"
    props = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {
        "nvidia_smi": smi,
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if props else None,
        "python": sys.version.split()[0],
        "name": props.name if props else None,
        "multiprocessors": props.multi_processor_count if props else None,
        "cpus": os.cpu_count(),
    }


def step_tests(out: Path) -> dict:
    xml = out.with_suffix(".junit.xml")
    code, log, seconds = run_timed(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "gpu or multigpu"]
        + ["-rA", "-q", f"--junitxml={xml}", "tests/test_gpus.py", "tests/test_outside_code.py"]
        + ["tests/test_device_corpus.py"],
        LIMITS["tests"] - 10,
        {"MPLBACKEND": "Agg", "DPLAB_OFFLINE": "1"},
    )
    said, late = said_and_late(log)
    return {"exit": code, "seconds": round(seconds, 1), "summary": said[-40:], "late": late}


def grade_gpu_class(folder: Path, keep: Path, label: str, jobs: int, env: dict) -> dict:
    """Grade the class under `folder` with the grader's command line, its JSON report kept as
    keep/gpu-check-class-LABEL.json (with whatever was graded before a time limit); return
    what came of it."""
    report = keep / f"gpu-check-class-{label}.json"
    report.unlink(missing_ok=True)
    code, log, seconds = run_timed(
        [sys.executable, "-m", "grader", "grade", str(folder / "submitted")]
        + ["--jobs", str(jobs), "--json", str(report)],
        max(5, LIMITS["class"] / 2 - 10),
        env,
    )
    subs = json.loads(report.read_text())["submissions"] if report.exists() else []
    said, late = said_and_late(log)
    return {
        "exit": code,
        "seconds": round(seconds, 1),
        "graded": len(subs),
        "by_id": {s["id"]: s for s in subs},
        "said": said[:2] + said[-3:],
        "late": late,
    }


def verdicts_of(sub: dict) -> dict[str, bool]:
    return {f"{e['name']}.{c['name']}": c["passed"] for e in sub["exercises"] for c in e["checks"]}


def step_class(students: int, jobs: int, keep: Path) -> dict:
    from grader.benchmarks.grade import KINDS, kind_of, make_class

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_class(folder / "submitted", students)
        gpu = grade_gpu_class(folder, keep, "gpu", jobs, {})
        cpu = grade_gpu_class(folder, keep, "cpu", jobs, {"CUDA_VISIBLE_DEVICES": ""})
    differ = {}
    for sid in gpu["by_id"].keys() & cpu["by_id"].keys():
        a, b = verdicts_of(gpu["by_id"][sid]), verdicts_of(cpu["by_id"][sid])
        changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if changed:
            differ[sid] = changed
    by_kind: dict[str, list] = {kind: [] for kind in KINDS}
    for sid, sub in gpu["by_id"].items():
        by_kind[kind_of(int(sid[len("student") :]) - 1)].append(sub["score"])
    full = max((sub["max_score"] for sub in gpu["by_id"].values()), default=None)
    found = {"students": students, "jobs": jobs, "full_marks": full, "scores_by_kind": by_kind}
    for label, graded in (("gpu", gpu), ("cpu", cpu)):
        times = [sub["seconds"] for sub in graded["by_id"].values()]
        found[label] = {k: v for k, v in graded.items() if k != "by_id"}
        found[label]["slowest_submission_s"] = round(max(times), 1) if times else None
    found["compared"] = sorted(gpu["by_id"].keys() & cpu["by_id"].keys())
    found["checks_compared"] = sum(len(verdicts_of(gpu["by_id"][i])) for i in found["compared"])
    found["verdicts_that_differ"] = differ
    found["references_full"] = all(s == full for s in by_kind[KINDS[0]])
    found["stubs_zero"] = all(s == 0 for s in by_kind[KINDS[1]])
    return found


def limits(given: list[str]) -> dict[str, float]:
    """Return the limits `--limit STEP=SECONDS` gives, or exit saying which one is wrong."""
    found = {}
    for item in given:
        name, _, seconds = item.partition("=")
        try:
            found[name] = float(seconds)
        except ValueError:
            found[name] = -1.0
        if name not in LIMITS or found[name] <= 0:
            sys.exit(
                f"gpu-check: --limit {item!r}: give STEP=SECONDS, a step of "
                f"{', '.join(STEPS)} and a number of seconds above 0"
            )
    return found


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m grader.benchmarks.gpu_check", description=__doc__)
    p.add_argument("--json", type=Path, default=Path("gpu-check.json"))
    p.add_argument("--steps", default=",".join(STEPS), help="which steps, comma-separated")
    p.add_argument("--students", type=int, default=20)
    p.add_argument("--jobs", type=int, default=max(2, min(8, (os.cpu_count() or 2) // 2)))
    p.add_argument("--epochs", type=int, default=10, help="the book's: 10")
    p.add_argument("--subset", type=int, nargs=2, metavar=("TRAIN", "TEST"), help="a try-out")
    p.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="STEP=SECONDS",
        help="a step's time limit, to fit a lease (defaults: "
        + ", ".join(f"{k}={v}" for k, v in LIMITS.items())
        + ")",
    )
    p.add_argument("--step", help=argparse.SUPPRESS)  # a child's one step
    p.add_argument("--keep", type=Path, help=argparse.SUPPRESS)  # where the class's reports go
    args = p.parse_args()
    LIMITS.update(limits(args.limit))
    if args.step:
        result = run_step(args)
        args.json.write_text(json.dumps(result, indent=1))
        return
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        sys.exit(f"gpu-check: no step {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for name in steps:
        results[name] = child_step(name, args)
        args.json.write_text(json.dumps(results, indent=1))
        print(f"gpu-check: {name} done: {summary(name, results[name])}", flush=True)
    print(table(results))
    failed = [name for name, r in results.items() if not passed(name, r)]
    sys.exit(f"gpu-check: failed: {', '.join(failed)}" if failed else 0)


def child_step(name: str, args: argparse.Namespace) -> dict:
    """Run step `name` in a Python of its own; return its result, or why it has none."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.json"
        forwarded = ["--students", str(args.students), "--jobs", str(args.jobs)]
        forwarded += ["--epochs", str(args.epochs), "--keep", str(args.json.parent.resolve())]
        forwarded += ["--subset", *map(str, args.subset)] if args.subset else []
        forwarded += [f"--limit={given}" for given in args.limit]
        code, log, seconds = run_timed(
            [
                sys.executable,
                "-m",
                "grader.benchmarks.gpu_check",
                "--step",
                name,
                "--json",
                str(out),
            ]
            + forwarded,
            LIMITS[name],
            {"DPLAB_FIGURE_DIR": tmp},  # the trainings' plots, not into the checkout
        )
        if code != 0 or not out.exists():
            return {"error": f"exit {code} after {seconds:.0f} s", "log": log[-4000:]}
        result = json.loads(out.read_text())
        result["step_seconds"] = round(seconds, 1)
        return result


def run_step(args: argparse.Namespace) -> dict:
    if args.step == "env":
        return step_env()
    if args.step == "tests":
        return step_tests(args.json)
    if args.step == "class":
        return step_class(args.students, args.jobs, args.keep)
    if args.step == "book":
        from grader.benchmarks.gpu_figures import book_figures

        return book_figures(args.epochs, args.subset)
    if args.step == "ddp":
        from grader.benchmarks.gpu_figures import ddp_figures

        return ddp_figures(args.subset)
    raise SystemExit(f"gpu-check: no step {args.step}")


def passed(name: str, r: dict) -> bool:
    if "error" in r:
        return False
    if name == "tests":
        return r["exit"] == 0
    if name == "class":
        complete = all(
            r[k]["exit"] == 0 and r[k]["graded"] == r["students"] for k in ("gpu", "cpu")
        )
        return (
            complete and not r["verdicts_that_differ"] and r["references_full"] and r["stubs_zero"]
        )
    if name == "ddp":
        return r["one_process"]["exit"] == 0
    return True


def summary(name: str, r: dict) -> str:
    if "error" in r:
        return f"FAILED ({r['error']}): " + r["log"].strip().splitlines()[-1:][0][:200]
    if name == "env":
        return f"{r['name']}, driver {r['nvidia_smi']}, CUDA {r['cuda']}, torch {r['torch']}"
    if name == "tests":
        return f"exit {r['exit']}, {r['summary'][-1] if r['summary'] else ''}"
    if name == "class":
        return (
            f"{r['students']} submissions; graded with the GPU {r['gpu']['graded']} in "
            f"{r['gpu']['seconds']} s (exit {r['gpu']['exit']}), without {r['cpu']['graded']} "
            f"in {r['cpu']['seconds']} s (exit {r['cpu']['exit']}); {r['checks_compared']} "
            f"verdicts compared, {sum(map(len, r['verdicts_that_differ'].values()))} differ"
        )
    if name == "book":
        return "; ".join(
            f"{m}: {r[m]['seconds_per_epoch']:.2f} s/epoch, acc {r[m]['test_acc'][-1]:.3f}"
            for m in ("lenet", "resnet18")
            if m in r
        )
    if name == "ddp":
        return f"one process exit {r['one_process']['exit']}, two exit {r['two_processes']['exit']}"
    return ""


def table(results: dict) -> str:
    lines = ["", "| step | passed | what it found |", "|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {'yes' if passed(name, r) else 'NO'} | {summary(name, r)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
