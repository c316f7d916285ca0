"""`make bench-hub`: a class's hub on this machine, timed and weighed (figures, never tested).

Starts the hub (process spawner) with a class of N students, then for each student: the time
from the login form to a lab whose files answer, the same after a restart, and the memory of
the idle lab, first alone and then with a kernel that ran the notebooks' first cell (torch,
dplab and the grader imported). From the memory the machine had free before and after, it
says how many such labs fit in it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import running  # noqa: E402

FIRST_CELL = "import torch\nfrom torch import nn\nimport dplab as d2l\nfrom grader import check\n"


def lab_memory(user: running.User, hub: running.Hub) -> float:
    """The proportional set size (MiB) of every process of this student's lab."""
    if os.geteuid() == 0:
        account = hub.env["HUB_USER_PREFIX"] + user.name
        procs = [p for p in psutil.process_iter(["username"]) if p.info["username"] == account]
    else:
        home = str(Path(hub.env["HUB_HOMES"]) / user.name)
        procs = [p for p in psutil.process_iter() if _environ(p).get("HOME") == home]
    return sum(_pss(p) for p in procs) / 2**20


def _environ(process: psutil.Process) -> dict:
    try:
        return process.environ()
    except (psutil.Error, OSError):
        return {}


def _pss(process: psutil.Process) -> int:
    try:
        return process.memory_full_info().pss
    except (psutil.Error, OSError):
        return 0


def start_kernel_with_first_cell(user: running.User) -> None:
    """A kernel left running after the notebooks' first cell, as a student's idle lab has."""
    kernel = user.lab_api("POST", "/kernels", json={"name": "python3"}).json()["id"]
    user.run_in(kernel, FIRST_CELL)


@dataclass
class Figures:
    """What the bench measured: seconds from login to a usable lab, MiB of each idle lab."""

    first: list[float]  # the first start of each student's lab
    again: list[float]  # a start after a stop (three students)
    bare: list[float]  # the lab's server alone
    with_kernel: list[float]  # with a kernel that ran the first cell
    free_after: int  # the machine's free memory (bytes) with every lab and kernel running


def hub_settings(homes: Path) -> dict[str, str]:
    """The hub's settings: processes, homes under `homes`, and as root, one account each."""
    settings = {"HUB_SPAWNER": "process", "HUB_HOMES": str(homes), "HUB_USER_PREFIX": "bench-"}
    if os.geteuid() == 0:
        settings["HUB_PYTHON"] = running.python_for_students(homes / "python")
        if not settings["HUB_PYTHON"]:
            raise SystemExit("bench-hub: no Python with the lab in it that other users may run")
    return settings


def measure(hub: running.Hub, students: list[str]) -> Figures:
    """Log every student in and time their labs' starts, then weigh the idle labs."""
    first, again = [], []
    for name in students:
        began = time.monotonic()
        user = hub.login(name)
        user.start_lab()
        first.append(time.monotonic() - began)
    users = {name: hub.login(name) for name in students}
    for user in users.values():
        user.start_lab()
    time.sleep(5)  # let the servers settle
    bare = [lab_memory(u, hub) for u in users.values()]
    for user in users.values():
        start_kernel_with_first_cell(user)
    time.sleep(5)
    with_kernel = [lab_memory(u, hub) for u in users.values()]
    free_after = psutil.virtual_memory().available
    for user in list(users.values())[:3]:
        user.stop_lab()
        began = time.monotonic()
        hub.login(user.name).start_lab()
        again.append(time.monotonic() - began)
    return Figures(first, again, bare, with_kernel, free_after)


def tear_down(hub: running.Hub, students: list[str], homes: Path, folder: Path) -> None:
    """Stop the hub; remove the students' accounts (as root), their homes and the hub's
    folder."""
    hub.stop()
    if os.geteuid() == 0:
        for name in students:
            os.system(
                f"pkill -KILL -u bench-{name} 2>/dev/null; userdel -r bench-{name} 2>/dev/null"
            )
    shutil.rmtree(homes, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)


def say(figures: Figures, students: int, free_before: int) -> None:
    """Print the figures, and how many labs with a kernel fit in the memory free before."""
    first, again, bare = figures.first, figures.again, figures.bare
    with_kernel = figures.with_kernel
    total = psutil.virtual_memory().total
    per_lab = (free_before - figures.free_after) / students / 2**20
    mode = "one account per student" if os.geteuid() == 0 else "one shared account"
    print(f"hub on this machine: {os.cpu_count()} cores, {total / 2**30:.1f} GiB; {mode}")
    print(f"{students} students, labs as processes of the lab's virtual environment")
    print(f"login to a usable lab, first start:  median {statistics.median(first):.1f} s, "
          f"longest {max(first):.1f} s")  # fmt: skip
    print(f"login to a usable lab, after a stop: median {statistics.median(again):.1f} s")
    print(f"idle lab, server alone:               median {statistics.median(bare):.0f} MiB (PSS)")
    print(f"idle lab with a kernel (first cell):  median {statistics.median(with_kernel):.0f} MiB "
          f"(PSS); {per_lab:.0f} MiB each from the machine's free memory")  # fmt: skip
    print(f"idle labs with a kernel that fit in the {free_before / 2**30:.1f} GiB free before the "
          f"hub started: about {int(free_before / 2**20 / max(per_lab, 1))}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="make bench-hub", description=__doc__.split("\n")[0])
    parser.add_argument("--students", type=int, default=8)
    args = parser.parse_args()
    if why := running.missing():
        raise SystemExit(f"bench-hub: {why}")
    folder = Path(tempfile.mkdtemp(prefix="bench-hub-"))
    homes = running.temporary_homes()
    students = [f"s{i:02d}" for i in range(args.students)]
    hub = running.Hub(folder, students, **hub_settings(homes))
    free_before = psutil.virtual_memory().available
    hub.start()
    try:
        figures = measure(hub, students)
    finally:
        tear_down(hub, students, homes, folder)
    say(figures, len(students), free_before)


if __name__ == "__main__":
    main()
