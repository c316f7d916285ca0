"""What a process is doing and how it ended, read from /proc and its wait status; and a
forked process that ends with its parent."""

import ctypes
import os
import signal
from pathlib import Path

from labtext import N_, _

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def processor_seconds(pid: int) -> float:
    """Return the processor time process `pid` has used so far, with that of its children
    that have ended and been waited for (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return sum(int(f) for f in fields[11:15]) / _TICKS


def children_of(pids: list[int]) -> dict[int, list[int]]:
    """Return each of `pids` with its descendants (a rank's DataLoader workers, say), found
    by their parents in /proc."""
    parent_of: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            parent_of[int(name)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    family = {pid: [pid] for pid in pids}
    for members in family.values():
        for member in members:  # grows as it goes: grandchildren too
            members += [c for c, parent in parent_of.items() if parent == member]
    return family


def describe_status(status: int) -> str:
    """Say in words how a rank's process ended, from its wait status."""
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        said = {
            "SIGSEGV": N_("crashed with a segmentation fault"),
            "SIGKILL": N_("was killed (SIGKILL), perhaps for using too much memory"),
            "SIGABRT": N_("aborted"),
        }.get(name, N_("was killed by {signal}"))
        return _(said).format(signal=name)
    return _("exited with code {code} without a result").format(
        code=os.waitstatus_to_exitcode(status)
    )


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def end_with_parent(parent: int) -> None:
    """Have the kernel kill this process when `parent`, which forked or started it, ends (even
    by `kill -9`, or for memory), and end now if it has already: ranks, and the children of
    a grader, must not live on holding memory and devices. Linux alone; elsewhere nothing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (AttributeError, OSError):
        return
    if os.getppid() != parent:
        os._exit(1)
