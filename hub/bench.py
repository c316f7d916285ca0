"""`make bench-hub`: a class's hub on this machine, timed and weighed (figures, never tested).

Starts the hub (process spawner, nbgrader's exchange) with a class of N students and the
assignment released, then goes through a class's round:

1. every student logs in at once: the time from the login form to a lab whose files answer;
2. each fetches the assignment and runs one check in a Terminal (`python -m grader check`, a
   few students at a time): its time, and the memory of each lab after it;
3. each submits; the instructor collects, then grades the class (`python -m grader grade`).

The machine's memory in use is sampled all along; the peak of each step is printed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hub import running

COURSE, ASSIGNMENT = "multigpu-lab", "multigpu"
CHECK = f"python -m grader check {ASSIGNMENT}/from_scratch.ipynb --exercise allreduce"


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


class MemoryPeak:
    """Samples the machine's memory in use (total less available) every `every` seconds; the
    peak of each step, in MiB, from `step(name)`."""

    def __init__(self, every: float = 0.25) -> None:
        self.every, self.peaks, self._now = every, {}, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.base = self._used()
        self._thread.start()

    @staticmethod
    def _used() -> float:
        memory = psutil.virtual_memory()
        return (memory.total - memory.available) / 2**20

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            if self._now:
                self.peaks[self._now] = max(self.peaks.get(self._now, 0.0), self._used())

    @contextmanager
    def step(self, name: str):
        self._now = name
        try:
            yield
        finally:
            self.peaks[name] = max(self.peaks.get(name, 0.0), self._used())
            self._now = ""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Figures:
    """What the bench measured: seconds, and MiB."""

    login: list[float] = field(default_factory=list)  # login form to a usable lab, all at once
    check: list[float] = field(default_factory=list)  # one check in a Terminal
    lab_after_check: list[float] = field(default_factory=list)  # each lab's PSS after it
    collect: float = 0.0
    grade: float = 0.0
    graded: str = ""  # what the grade said of the class


def hub_settings(homes: Path, exchange: Path) -> dict[str, str]:
    """The hub's settings: processes, homes under `homes`, the exchange, and as root, one
    account each."""
    settings = {"HUB_SPAWNER": "process", "HUB_HOMES": str(homes), "HUB_USER_PREFIX": "bench-",
                "HUB_EXCHANGE": str(exchange)}  # fmt: skip
    if os.geteuid() == 0:
        settings["HUB_PYTHON"] = running.python_for_students(homes / "python")
        if not settings["HUB_PYTHON"]:
            raise SystemExit("bench-hub: no Python with the lab in it that other users may run")
    return settings


def nbgrader(*args: str, cwd: Path = running.REPO) -> None:
    """nbgrader's command, run by the instructor from the lab's folder (its nbgrader_config)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               HUB_USER_PREFIX="bench-")  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"bench-hub: nbgrader {args[0]} failed:\n{done.stderr[-2000:]}")


def log_in_and_start(hub: running.Hub, name: str) -> tuple[running.User, float]:
    began = time.monotonic()
    user = hub.login(name)
    user.start_lab(timeout=600)
    return user, time.monotonic() - began


def fetch_and_check(user: running.User) -> float:
    """Fetch the assignment in the lab, then one check in its Terminal: the check's seconds."""
    form = {"course_id": COURSE, "assignment_id": ASSIGNMENT}
    fetched = user.in_lab("POST", "/assignments/fetch", data=form)
    if fetched.status_code != 200:
        raise SystemExit(f"bench-hub: {user.name} could not fetch: {fetched.text[:300]}")
    began = time.monotonic()
    shown, status = user.terminal(CHECK, timeout=900)
    if status not in (0, 1):  # 1: the stub's check fails, as it should
        raise SystemExit(f"bench-hub: {user.name}'s check ended with {status}:\n{shown[-2000:]}")
    return time.monotonic() - began


def submit(user: running.User) -> None:
    form = {"course_id": COURSE, "assignment_id": ASSIGNMENT}
    said = user.in_lab("POST", "/assignments/submit", data=form)
    if said.status_code != 200 or '"success": false' in said.text:
        raise SystemExit(f"bench-hub: {user.name} could not submit: {said.text[:300]}")


def class_round(hub: running.Hub, students: list[str], course: Path, exchange: Path,
                at_once: int, memory: MemoryPeak) -> Figures:  # fmt: skip
    """Logins at once, a fetch and a check each, submits, collect and grade."""
    figures = Figures()
    with memory.step("logins at once"), ThreadPoolExecutor(len(students)) as pool:
        started = list(pool.map(lambda name: log_in_and_start(hub, name), students))
    users = [user for user, _ in started]
    figures.login = [seconds for _, seconds in started]
    with memory.step(f"a check each, {at_once} at a time"), ThreadPoolExecutor(at_once) as pool:
        figures.check = list(pool.map(fetch_and_check, users))
    figures.lab_after_check = [lab_memory(user, hub) for user in users]
    for user in users:
        submit(user)
    with memory.step("collect"):
        began = time.monotonic()
        nbgrader("collect", ASSIGNMENT, f"--Exchange.root={exchange}",
                 f"--CourseDirectory.root={course}")  # fmt: skip
        figures.collect = time.monotonic() - began
    with memory.step("grade, 2 jobs"):
        began = time.monotonic()
        graded = subprocess.run(
            [sys.executable, "-m", "grader", "grade", str(course / "submitted"), "--jobs", "2"],
            capture_output=True, text=True,
        )  # fmt: skip
        figures.grade = time.monotonic() - began
    if graded.returncode:
        raise SystemExit(f"bench-hub: grade failed:\n{graded.stderr[-2000:]}")
    counted = re.findall(r"\((\d+/\d+ graded)", graded.stderr)
    figures.graded = counted[-1] if counted else ""
    return figures


def tear_down(hub: running.Hub, students: list[str], folders: list[Path]) -> None:
    """Stop the hub; remove the students' accounts (as root) and the bench's folders."""
    hub.stop()
    if os.geteuid() == 0:
        from hub.lab_hub import remove_account

        for name in students:
            remove_account(f"bench-{name}")
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def print_figures(figures: Figures, students: int, at_once: int, memory: MemoryPeak) -> None:
    total = psutil.virtual_memory().total
    mode = "one account per student" if os.geteuid() == 0 else "one shared account"
    median, worst = statistics.median, max
    print(f"hub on this machine: {os.cpu_count()} cores, {total / 2**30:.1f} GiB; {mode}")
    print(f"{students} students, labs as processes, nbgrader's exchange")
    print(f"login to a usable lab, all at once:  median {median(figures.login):.1f} s, "
          f"worst {worst(figures.login):.1f} s")  # fmt: skip
    print(f"one check in a Terminal, {at_once} at a time: median {median(figures.check):.1f} s, "
          f"worst {worst(figures.check):.1f} s")  # fmt: skip
    print(f"a lab after its check (server, Terminal, grader): median "
          f"{median(figures.lab_after_check):.0f} MiB, largest "
          f"{worst(figures.lab_after_check):.0f} MiB (PSS)")  # fmt: skip
    print(f"collect: {figures.collect:.1f} s; grade the class (2 jobs): {figures.grade:.1f} s"
          f"{f' ({figures.graded})' if figures.graded else ''}")  # fmt: skip
    print(f"memory in use before the hub started: {memory.base / 1024:.1f} GiB; peak of each step:")
    for step, peak in memory.peaks.items():
        print(f"  {step:<32} {peak / 1024:.1f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(prog="make bench-hub", description=__doc__.split("\n")[0])
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument(
        "--checks-at-once", type=int, default=4, metavar="K",
        help="students whose checks run side by side (default: %(default)s)",
    )  # fmt: skip
    args = parser.parse_args()
    if why := running.hub_lacks():
        raise SystemExit(f"bench-hub: {why}")
    folder = Path(tempfile.mkdtemp(prefix="bench-hub-"))  # closed: the instructor's course
    homes = running.temporary_homes()  # open: the students' homes, their Python, the exchange
    exchange = homes / "exchange"
    students = [f"s{i:02d}" for i in range(args.students)]
    hub = running.Hub(folder, students, **hub_settings(homes, exchange))
    memory = MemoryPeak()
    try:
        with memory.step("hub start, release"):
            hub.start()
            nbgrader("release_assignment", ASSIGNMENT, f"--Exchange.root={exchange}")
        figures = class_round(hub, students, folder / "course", exchange,
                              min(args.checks_at_once, len(students)), memory)  # fmt: skip
    finally:
        memory.stop()
        tear_down(hub, students, [homes, folder])
    print_figures(figures, len(students), min(args.checks_at_once, len(students)), memory)


if __name__ == "__main__":
    main()
