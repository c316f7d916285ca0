"""The kernel's control groups that hold each lab of the process spawner: its memory and CPU
limits, and every process it starts, so that stopping the lab stops them all.

hub/lab_hub.py's LabProcessSpawner makes a lab's group before the lab starts and removes it
when the lab stops; cgroup v2 and v1 are both found from /proc. `FIX_LIMITS` says what to do
where the machine lets the hub make none.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import time
from pathlib import Path

LABS_GROUP = "multigpu-labs"  # under the hub's own control group: one group in it per lab
HUB_LEAF = "multigpu-lab-hub"  # cgroup v2: where the hub's own processes go (see LabGroups)
FIX_LIMITS = (
    "To have them, run the hub as root where the kernel's control groups can be written: "
    "cgroup v2 with the cpu and memory controllers (a systemd service with Delegate=yes, as "
    "docs/hub/multigpu-lab-hub.service has), or cgroup v1 with its memory and cpu "
    "hierarchies mounted under /sys/fs/cgroup; or run the labs as containers "
    "(HUB_SPAWNER=docker)"
)


def _cgroup_mounts(mountinfo: Path) -> list[tuple[str, str, str, set[str]]]:
    """Each control group file system: (the group at its root, where it is mounted, cgroup
    or cgroup2, its options, which name a v1 hierarchy's controllers)."""
    found = []
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) > 4 and len(kind) > 2 and kind[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], fields[4], kind[0], set(kind[2].split(","))))
    return found


def _below(group: str, root: str) -> str:
    """`group` (as /proc/PID/cgroup names it) relative to a mount whose root is `root`."""
    inside = os.path.relpath(group, root) if group.startswith(root) else group
    return inside.strip("/").removeprefix(".")


class LabGroups:
    """The kernel's control groups that hold each lab, with its memory and CPU limits.

    Made under the hub's own group: with cgroup v2 (its cpu and memory controllers there) in
    `multigpu-labs/<account>`, the hub's own processes moving to `multigpu-lab-hub` beside
    it (v2 lets only a group without processes of its own hand controllers down); with
    cgroup v1 in `multigpu-labs/<account>` of the memory and the cpu hierarchies. A lab's
    first process joins its group before it becomes the student's (`make` gives the files to
    join by), so that every process of the lab is in it, a warm server or a kernel's children
    as much as the server; none can leave, as the groups are root's. Stopping the lab kills
    what is left in the group and removes it (`remove`), and `multigpu-labs` with the last.
    `why` says why there are none, where there are none."""

    def __init__(self, proc: Path = Path("/proc/self")) -> None:
        self.version = 0
        self.parents: list[Path] = []  # where the labs' groups are made: one per hierarchy
        self.why = ""
        try:
            self._find(proc)
        except OSError as error:
            self.version, self.parents = 0, []
            self.why = f"the hub could not make the labs' control groups ({error})"

    def _find(self, proc: Path) -> None:
        mounts = _cgroup_mounts(proc / "mountinfo")
        mine: dict[str, str] = {}  # controller ("" for v2) -> the hub's group
        for line in (proc / "cgroup").read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                mine[controller] = group
        for root, point, kind, _options in mounts:
            if kind == "cgroup2" and "" in mine:
                base = Path(point) / _below(mine[""], root)
                if {"cpu", "memory"} <= set((base / "cgroup.controllers").read_text().split()):
                    self._prepare_v2(base)
                    return
        v1 = {}
        for controller in ("memory", "cpu"):
            for root, point, kind, options in mounts:
                if kind == "cgroup" and controller in options and controller in mine:
                    v1[controller] = Path(point) / _below(mine[controller], root) / LABS_GROUP
                    break
        if len(v1) < 2:
            self.why = (
                "this machine has neither cgroup v2 with the cpu and memory controllers nor "
                "cgroup v1's memory and cpu hierarchies"
            )
            return
        self.version, self.parents = 1, list(dict.fromkeys(v1.values()))  # (or one, shared)
        self._try_parents()

    def _prepare_v2(self, base: Path) -> None:
        """Hand the cpu and memory controllers down to the labs' groups. A group other than
        the root hands them down only while it holds no process of its own: where the hub's
        holds some (the hub's, a service's), they move to `multigpu-lab-hub` first."""
        try:
            (base / "cgroup.subtree_control").write_text("+cpu +memory")
        except OSError as error:
            if error.errno != errno.EBUSY:
                raise
            leaf = base / HUB_LEAF
            leaf.mkdir(exist_ok=True)
            for pid in (base / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):  # (one that ended since)
                    (leaf / "cgroup.procs").write_text(pid)
            (base / "cgroup.subtree_control").write_text("+cpu +memory")
        self.version, self.parents = 2, [base / LABS_GROUP]
        self._try_parents()

    def _try_parents(self) -> None:
        """Make the labs' parent groups and remove them again: they can be made here."""
        for parent in self.parents:
            self._open(parent)
            with contextlib.suppress(OSError):  # (another hub's labs are in it)
                parent.rmdir()

    def _open(self, parent: Path) -> None:
        """Make the labs' parent group `parent` where it is missing; with cgroup v2, hand it
        the cpu and memory controllers for its groups."""
        parent.mkdir(exist_ok=True)
        if self.version == 2:
            (parent / "cgroup.subtree_control").write_text("+cpu +memory")

    def described(self) -> str:
        """Where the labs' groups are, for the hub's log."""
        where = " and ".join(str(p) for p in self.parents)
        return f"cgroup v{self.version}, in {where}"

    def groups(self, name: str) -> list[Path]:
        return [parent / name for parent in self.parents]

    def make(self, name: str, memory: int | None, cpus: float | None) -> list[Path]:
        """Make the group `name` (emptied, where a hub that ended abruptly left it) with at
        most `memory` bytes and `cpus` processors (None: no limit); return the files a
        process writes its id to, to join it."""
        self.kill(name)
        made = []
        for group in self.groups(name):
            for _ in range(3):  # (another hub that had the last lab may remove the parent)
                self._open(group.parent)
                with contextlib.suppress(FileNotFoundError):
                    group.mkdir(exist_ok=True)
                    break
            if self.version == 2:
                _write(group / "memory.max", str(memory) if memory else "max")
                _write(group / "memory.swap.max", "0" if memory else "max", missing_ok=True)
                quota = str(_quota(cpus)) if cpus else "max"
                _write(group / "cpu.max", f"{quota} {CPU_PERIOD}")
            elif (group / "memory.limit_in_bytes").exists():
                # memory and swap together: never below the memory alone, so opened first
                _write(group / "memory.memsw.limit_in_bytes", "-1", missing_ok=True)
                _write(group / "memory.limit_in_bytes", str(memory or -1))
                _write(group / "memory.memsw.limit_in_bytes", str(memory or -1), missing_ok=True)
            if self.version == 1 and (group / "cpu.cfs_quota_us").exists():
                _write(group / "cpu.cfs_period_us", str(CPU_PERIOD))
                _write(group / "cpu.cfs_quota_us", str(_quota(cpus) if cpus else -1))
            made.append(group / "cgroup.procs")
        return made

    def kill(self, name: str, timeout: float = 10) -> bool:
        """Kill every process in the group `name`; whether none is left."""
        deadline = time.monotonic() + timeout
        for group in self.groups(name):
            if not group.is_dir():
                continue
            with contextlib.suppress(OSError):  # cgroup.kill: Linux 5.14 and later, v2
                (group / "cgroup.kill").write_text("1")
            while pids := _read(group / "cgroup.procs").split():
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
        return True

    def remove(self, name: str, timeout: float = 10) -> bool:
        """Kill what is left in the group `name` and remove it, and the labs' parent group
        with it where it was the last; whether it is gone."""
        self.kill(name, timeout)
        deadline = time.monotonic() + timeout
        for group in self.groups(name):
            while group.is_dir():
                try:
                    group.rmdir()
                except OSError:  # busy a moment while its last processes exit
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
            with contextlib.suppress(OSError):  # (other labs' groups are in it)
                group.parent.rmdir()
        return True


CPU_PERIOD = 100_000  # microseconds: the CPU limit is a quota of this period


def _quota(cpus: float) -> int:
    """The quota of `cpus` processors per period (the kernel's least is 1 ms)."""
    return max(1000, int(cpus * CPU_PERIOD))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _write(path: Path, value: str, missing_ok: bool = False) -> None:
    """Write a control group's file; with `missing_ok`, one this kernel lacks is passed
    over (a control group's folder refuses new files)."""
    if missing_ok and not path.exists():
        return
    path.write_text(value)


@functools.cache
def lab_groups() -> LabGroups:
    """The labs' control groups of this hub, found (and the hub's own group prepared) once."""
    return LabGroups()
