"""Processes of a test held in a cgroup (v1) of its own, with a memory cap and a processor
quota, as Gradescope runs an autograder, and the kernel's memory killer made to take one of
them. Needs root and a writable v1 hierarchy: tests that use it skip, saying so, elsewhere.
(This machine's cgroup v2 has no memory controller, so v1 is what runs here.)"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


def children_of() -> dict[int, list[int]]:
    """Every process's children, read from /proc."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            found.setdefault(parent, []).append(int(entry.name))
    return found


def tree(pid: int) -> set[int]:
    """`pid` and every process below it."""
    kids, found, todo = children_of(), set(), [pid]
    while todo:
        found.add(todo[-1])
        todo.extend(k for k in kids.get(todo.pop(), []) if k not in found)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` that still run (a zombie has ended: only its entry waits)."""
    living = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            living.add(pid)
    return living


def _own(controller: str) -> Path:
    """This process's cgroup folder of `controller`; skips where it cannot be written."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, names, path = line.split(":", 2)
        if controller in names.split(","):
            folder = Path(f"/sys/fs/cgroup/{controller}{path}")
            if os.access(folder, os.W_OK):
                return folder
    pytest.skip(f"needs a writable cgroup v1 {controller} hierarchy (root, outside a container)")


class LimitedGroup:
    """A memory cgroup (and, given `cpus`, a cpu one) below this process's own."""

    def __init__(self, memory: int | None = None, cpus: float | None = None) -> None:
        self.folders = [Path(tempfile.mkdtemp(prefix="test-", dir=_own("memory")))]
        self.memory = self.folders[0]
        if memory is not None:
            self.cap(memory)
        if cpus is not None:
            cpu = Path(tempfile.mkdtemp(prefix="test-", dir=_own("cpu")))
            self.folders.append(cpu)
            (cpu / "cpu.cfs_period_us").write_text("100000")
            (cpu / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))

    def cap(self, memory: int) -> None:
        """Cap the group's memory, swap counted in (where the kernel counts it)."""
        (self.memory / "memory.limit_in_bytes").write_text(str(memory))
        with contextlib.suppress(OSError):
            (self.memory / "memory.memsw.limit_in_bytes").write_text(str(memory))

    def prefix(self) -> list[str]:
        """Words before a command, which then runs in this group (and all it starts)."""
        joins = " && ".join(f"echo $$ > {f}/cgroup.procs" for f in self.folders)
        return ["sh", "-c", f'{joins} && exec "$@"', "enter"]

    def read(self, name: str) -> str:
        return (self.memory / name).read_text()

    def kills(self) -> int:
        """How many processes the kernel has killed here for memory."""
        for line in self.read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def run_out(self, victim: int) -> None:
        """Make the kernel kill `victim` (of this group) for memory: it is made the first
        to go (as the largest process is), the group's memory is capped a little above what
        it holds, and a process that may not be killed fills it until the victim is gone."""
        Path(f"/proc/{victim}/oom_score_adj").write_text("1000")
        self.cap(int(self.read("memory.usage_in_bytes")) + 256 * 2**20)
        fill = (
            "import os, time, sys\n"
            "open('/proc/self/oom_score_adj', 'w').write('-1000')\n"
            "held, end = [], time.monotonic() + 60\n"
            "while os.path.exists(f'/proc/{sys.argv[1]}') and time.monotonic() < end:\n"
            "    held.append(bytearray(16 * 2**20))\n"
            "    time.sleep(0.01)\n"
        )
        subprocess.run([*self.prefix(), sys.executable, "-c", fill, str(victim)],
                       timeout=120, check=False)  # fmt: skip

    def remove(self) -> None:
        """Kill what is left in the group, and remove it."""
        for folder in self.folders:
            for pid in alive({int(p) for p in (folder / "cgroup.procs").read_text().split()}):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while folder.exists() and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    folder.rmdir()
                time.sleep(0.1)
