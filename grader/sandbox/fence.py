"""The fence around the grading child: what it may not do, and who enforces it.

Two layers:
- the operating system, where it allows: the child gets its own network namespace (nothing
  in it but its own loopback interface, which reaches no other machine and no other child)
  and mount namespace (the hidden checks, the reference solutions, the mistake catalogue and
  the repository's history are covered by empty folders, and its temporary folder is a file
  system in memory that it and its ranks alone see: `private_tmp`), runs under a user id of its own
  when the grader runs as root (so it can touch neither the grader's files nor another
  child's), and keeps no capabilities;
- Python's audit hooks (grader.sandbox.audit), always, inside the child: no sockets, no new
  processes, no reading of the private folders, no writing outside the child's own scratch
  folder.

Two exceptions, both forks of the child (or of its ranks) that stay behind the same fence:
they inherit its namespaces, user id, limits and audit hook.
- For the distributed exercises, the lab's launcher (`dplab.rank.fork_rank`, and no other code)
  may fork the ranks of a process group. They talk to each other over the child's own
  loopback (gloo's sockets), and end with their child at the latest: the launcher stops them
  when they fail, wait on each other or pass their processor-time limit, the cases of a
  notebook's exercises share them only while no case changes them (grader.ranks), and the
  grader stops the child's whole process group when it stops the child.
- PyTorch's DataLoader may fork its worker processes (`num_workers`), as every real training
  loop has it do: only multiprocessing's own fork of a process that runs torch's own worker
  loop, started by the DataLoader's own iterator (`audit.loader_worker_test`; the objects compared
  are taken when the hook is installed, before any student code runs). A worker runs the
  student's Dataset and collate function behind the fence it inherits, may start no process
  of its own, and ends with its loader, or when its parent is gone; a rank left with a live
  child after a case serves no more cases (grader.ranks). Workers hand their batches over
  in shared memory, whose file descriptors multiprocessing passes over a Unix socket in the
  child's temporary folder: Unix sockets whose address is in the child's scratch folder
  (which holds its temporary one) are allowed, as they reach none but the child's own
  processes; any other socket is not.
Other start methods (spawn, forkserver) would exec a new Python without the hooks, through a
call that raises no audit event: the child replaces it with one that refuses
(`audit._refuse_fork_exec`), and says to keep the default start method or num_workers=0.

The audit layer alone can be got round with ctypes; it is the fallback where the system
allows no namespaces (`describe()` says which layers are on).
"""

import itertools
import os
import resource
import shlex
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from grader import settings
from grader.manifest import REPO, load_manifest, solutions_dir
from grader.ranks.loopback import NO_LOOPBACK
from labtext import N_, _


def private_paths() -> list[Path]:
    """Return the folders the student's code must not read: the reference solutions, the
    manifest's hidden checks and mistake catalogues, the repository's history, and the
    folders of the warm fork servers' sockets (a connection there runs grader commands
    outside the fence)."""
    manifest = load_manifest()
    folders = [
        solutions_dir(),
        *(manifest.package_folder(p) for p in manifest.private_packages),
        REPO / ".git",
        *warm_folders(),
    ]
    return list(dict.fromkeys(p.resolve() for p in folders if p.exists()))


def warm_folders() -> list[Path]:
    """Return where warm fork servers listen: the folder asked for (`GRADER_WARM_DIR`) and
    the default one, in the runtime folder or the temporary one (grader.sandbox.fast)."""
    import tempfile

    name = f"grader-warm-{os.getuid()}"
    found = [Path(tempfile.gettempdir()) / name]
    if settings.RUNTIME_DIR.get():
        found.insert(0, Path(settings.RUNTIME_DIR.get()) / name)
    if settings.WARM_DIR.get():
        found.insert(0, Path(settings.WARM_DIR.get()))
    return found


CHILD_UIDS = range(61000, 65000)  # one per grading child when the grader runs as root
_next_uid = itertools.count()
_uid_lock = threading.Lock()


def next_child_uid() -> int:
    """Return a user id for the next child, so that no two children share one."""
    with _uid_lock:
        return CHILD_UIDS[next(_next_uid) % len(CHILD_UIDS)]


@dataclass(frozen=True)
class Fence:
    """How the child is started, and what that enforces."""

    namespaces: str  # "" (none), "root" (made as root) or "user" (in a user namespace)
    own_uid: bool  # the child runs under a user id of its own
    description: str  # in English (see `described`)
    loopback: bool = True  # the child's loopback is up, so process groups can form

    def described(self) -> str:
        """Return the description in the reader's language."""
        alone = self.description.removesuffix(f"; {NO_LOOPBACK}")
        if alone == self.description:
            return _(alone)
        return _("{fence}; {problem}").format(fence=_(alone), problem=_(NO_LOOPBACK))

    def prefix(self, uid: int | None, tmp: Path | None = None, memory_gib: float = 0) -> list[str]:
        """Return the words before `python` for a child running as `uid` (if own_uid), whose
        temporary folder `tmp` (if given) is its own (see `private_tmp`)."""
        if not self.namespaces:
            return []
        script = _mask_script(uid if self.own_uid else None, tmp, memory_gib)
        user = ["--user", "--map-root-user"] if self.namespaces == "user" else []
        return ["unshare", *user, "--net", "--mount", "sh", "-c", script, "fence"]


# Brings up the loopback interface of a new network namespace, which starts down (gloo's
# ranks talk over it). Standalone, so that the started child's fence script runs it in a
# Python that imports nothing else; `loopback_up` runs it in a forked child.
LOOPBACK_UP = """
import fcntl, socket, struct
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    name = struct.pack("16sh", b"lo", 0)
    flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, name))[1]
    if not flags & 1:
        fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))
"""


def loopback_up() -> bool:
    """Bring up this network namespace's loopback; return False where that is not allowed."""
    try:
        exec(LOOPBACK_UP, {})
        return True
    except OSError:
        return False


def private_tmp(uid: int | None, memory_gib: float) -> str:
    """Return the mount options of a child's temporary folder: a memory file system seen by
    the child and its ranks alone, gone with them, owned by the child's user (`uid`, if it
    has one of its own), as large as the child's data memory may be (`memory_gib`, 0: no
    limit of its own). The ranks of a case create and delete some 40 files; on ext4, each
    new file cost a search of the inode table for recently deleted entries (4 % of the
    processor time of a class's grading)."""
    options = ["mode=0700"]
    if memory_gib > 0:
        options.append(f"size={max(1, round(memory_gib * 1024))}m")
    if uid is not None:
        options += [f"uid={uid}", f"gid={uid}"]
    return ",".join(options)


def _mask_script(uid: int | None, tmp: Path | None = None, memory_gib: float = 0) -> str:
    """Return the shell lines run inside the new namespaces before Python starts."""
    lines = [
        "set -e",
        "mount --make-rprivate /",
        # (ending with this shell, as everything the grader starts ends with it)
        f'setpriv --pdeathsig=KILL "$1" -I -S -c {shlex.quote(LOOPBACK_UP)} 2>/dev/null || true',
    ]
    lines += [
        f"mount -t tmpfs -o size=16k,mode=000 tmpfs {shlex.quote(str(p))}" for p in private_paths()
    ]
    if tmp is not None:  # (where it cannot be mounted, the folder is used as it is)
        options = private_tmp(uid, memory_gib)
        lines.append(f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(tmp))} || true")
    # A change of user clears what the grader set for the child to end with it
    # (dplab.processes.ending_with_this_process): setpriv sets it again after its own.
    drop = ["setpriv", "--pdeathsig=KILL", "--no-new-privs", "--inh-caps=-all"]
    drop.append("--bounding-set=-all")
    if uid is not None:
        drop += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    lines.append("exec " + " ".join(drop) + ' "$@"')
    return "; ".join(lines)


def needed_paths() -> list[str]:
    """Return the folders a child must read: this Python's standard library and packages,
    and the repository. (A Python installed in a home folder that only its owner may
    enter, as pyenv's under /root, rules out a user id of the child's own.)"""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["stdlib"], paths["purelib"], paths["platlib"], str(REPO)]))


# PyTorch's OpenMP threads spin while they wait for each other. On a machine whose cores are
# busy with other work, that spinning made one grade take 74 s instead of 9 s (2 cores, one
# of them kept busy). Children use one thread (grader.grading.default_threads); this keeps
# code that asks for more from spinning.
WAIT_POLICY = "PASSIVE"


def with_import_path(env: dict[str, str]) -> dict[str, str]:
    """Return `env` with a PYTHONPATH that lets a process working in another folder import
    the grader, dplab and labtext from where this process did: its entries made absolute,
    and the folder that holds the grader added where this process found it on its own path
    (`PYTHONPATH=.`, or `python -m grader` run in a checkout that is not installed). A child
    started without it met "No module named 'grader'" in its scratch folder."""
    entries = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    root = Path(__file__).resolve().parents[2]  # the folder that holds grader/
    on_path = {Path(p or ".").resolve() for p in sys.path}
    sites = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    if root in on_path and root not in sites and str(root) not in entries:
        entries.append(str(root))
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def can_read(paths: list[str]) -> bool:
    """Return True if this process may list and read every one of `paths`."""
    return all(os.access(p, os.R_OK | os.X_OK) for p in paths)


_PROBE = (
    "import os, sys; "
    "assert all(os.access(p, os.R_OK | os.X_OK) for p in sys.argv[1:]); "
    "import grader.manifest; "
    "from grader.ranks.loopback import loopback_is_up; "
    "print('loopback' if loopback_is_up() else 'no loopback')"
)


def _probe(fence: Fence) -> bool | None:
    """Return None where `fence` cannot start a child, else whether its loopback comes up."""
    # Python starts behind the fence and, as the child's user, reads what the child needs
    # (importing torch here would cost seconds on every run).
    probe = [*fence.prefix(CHILD_UIDS[-1]), sys.executable, "-c", _PROBE, *needed_paths()]
    try:
        proc = subprocess.run(
            probe,
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            cwd="/",
            env=with_import_path(dict(os.environ)),
            preexec_fn=ending_with_this_process(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() == b"loopback"


@cache
def choose_fence() -> Fence:
    """Return the strongest fence this machine allows (probed once per process)."""
    none = Fence("", False, N_("no operating-system fence: Python's audit hooks only"))
    if settings.FENCE.get() == "none" or not shutil.which("unshare"):
        return none
    candidates = [
        Fence(
            "user",
            False,
            N_("own network and mount namespaces, private folders masked (in a user namespace)"),
        )
    ]
    if os.geteuid() == 0:
        candidates = [
            Fence(
                "root",
                True,
                N_(
                    "own network and mount namespaces, private folders masked, a user id of "
                    "its own per child"
                ),
            ),
            Fence(
                "root",
                False,
                N_(
                    "own network and mount namespaces, private folders masked, runs as root "
                    "without capabilities"
                ),
            ),
            *candidates,
        ]
    # The strongest fence whose loopback comes up (a container without NET_ADMIN cannot bring
    # it up as root, but can inside a user namespace); failing that, the strongest that works,
    # which grades all but the process groups and says why not.
    works = []
    for fence in candidates:  # each probe starts a Python behind the fence: stop at the first
        up = _probe(fence)
        if up:
            return fence
        if up is not None:
            works.append(fence)
    if works:
        fence = works[0]
        return replace(fence, loopback=False, description=f"{fence.description}; {NO_LOOPBACK}")
    return none


# ---- the same fence, entered by a forked child (see grader.sandbox.fast.forkserver) -------------
# What `unshare` and `setpriv` do in `Fence.prefix`, done from Python with the same system
# calls, in a process that has just been forked (single-threaded, as unshare needs).

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
_CAPABILITY_VERSION_3 = 0x20080522


class FenceError(OSError):
    """A forked child could not enter its fence; it must not run student code."""


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    import ctypes

    if result != 0:
        errno = ctypes.get_errno()
        raise FenceError(errno, f"{what}: {os.strerror(errno)}")


def _empty_bounding_set(libc) -> None:
    """Drop every capability from the bounding set (while this process may still do so)."""
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1


def _drop_capabilities(libc) -> None:
    """Empty the effective, permitted and inheritable sets; no privileges through exec."""
    import ctypes

    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _call(libc.capset(header, data), "capset")
    _call(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def enter(
    fence: "Fence",
    uid: int | None,
    private: list[Path],
    tmp: Path | None = None,
    memory_gib: float = 0,
) -> None:
    """Put this (freshly forked) process behind `fence`, as `Fence.prefix` would start it."""
    if not fence.namespaces:
        return
    libc = _libc()
    outer_uid, outer_gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | CLONE_NEWNS | (CLONE_NEWUSER if fence.namespaces == "user" else 0)
    _call(libc.unshare(flags), "unshare")
    if fence.namespaces == "user":  # be root inside, as `unshare --map-root-user`
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {outer_uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {outer_gid} 1")
    _call(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    loopback_up()
    for path in private:
        target = os.fsencode(path)
        _call(libc.mount(b"tmpfs", target, b"tmpfs", 0, b"size=16k,mode=000"), f"mask {path}")
    if tmp is not None:  # (where it cannot be mounted, the folder is used as it is)
        options = private_tmp(uid if fence.own_uid else None, memory_gib)
        libc.mount(b"tmpfs", os.fsencode(tmp), b"tmpfs", 0, options.encode())
    _empty_bounding_set(libc)
    if uid is not None and fence.own_uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _drop_capabilities(libc)


# ---- ending with the grader ----------------------------------------------------------------

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def ending_with_this_process() -> Callable[[], None]:
    """Return what a process forked from this one runs first (a `preexec_fn` for Popen, or
    the fork server's first step in a forked child): the kernel is to kill it when this
    process ends, even by `kill -9` or for memory, and it ends at once if this one already
    has. A child still importing torch when its grader was killed for memory lived on for
    seconds, holding the memory that the report of the grader's end needed. The signal comes
    when the *thread* that forked it ends, so fork from a thread that waits for the child.
    A change of user clears it: run it again after one (dplab.processes.end_with_parent
    does the same for ranks)."""
    parent, prctl, kill = os.getpid(), _libc().prctl, int(signal.SIGKILL)

    def arm() -> None:  # between fork and exec: nothing to import, no lock to take
        prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


MAX_FILE = 256 * 2**20  # no file the child writes may grow beyond this


def child_limits(memory_gib: float) -> dict[int, int]:
    """Return a child's resource limits: data memory (if any), file size, no core dumps."""
    limits = {resource.RLIMIT_FSIZE: MAX_FILE, resource.RLIMIT_CORE: 0}
    if memory_gib > 0:
        limits[resource.RLIMIT_DATA] = int(memory_gib * 2**30)
    return limits


def limit_process(pid: int, memory_gib: float) -> None:
    """Set a started child's limits (see `child_limits`)."""
    for kind, value in child_limits(memory_gib).items():
        resource.prlimit(pid, kind, (value, value))
