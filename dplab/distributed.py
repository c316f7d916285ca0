"""Start a process group on this machine and run a function in every process of it.

`launch(fn, args, nprocs=N)` forks N processes, each of which joins one process group
(`torch.distributed`) and calls `fn(*args)`. It is what `torchrun --nproc-per-node N` does for
a script, made for functions defined in a notebook:

- the backend is NCCL with one GPU per process where there are N GPUs, else gloo on the CPU;
- the processes meet through a `FileStore` in a fresh temporary folder, so no port is chosen
  and two launches never collide; each process also finds `RANK`, `LOCAL_RANK`, `WORLD_SIZE`
  and `LOCAL_WORLD_SIZE` in its environment, as under torchrun;
- each process computes with one CPU thread, as torchrun's processes do by default;
- what each process prints is shown as it comes, behind `[rank r]`; rank 0's plots are
  shown in the notebook once the run ends;
- a process that raises, dies, computes nothing for `idle_timeout` seconds (a deadlock) or
  runs past `timeout` stops the whole group, and the error names the rank and says where each
  rank was. Ranks blocked in torch.distributed's own waits are called deadlocked sooner, once
  no thread of theirs has run or waited to run for QUIET_SECONDS and none runs Python when
  asked to (a rank in `time.sleep` would): on a machine without a GPU, which a rank could
  wait for.

It returns a `Launched`: rank 0's return value as `.result`, every rank's in `.results`,
and what each rank printed in `.outputs`.
"""

import contextlib
import faulthandler
import importlib
import os
import pickle
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

MAX_PROCESSES = 16
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Launched:
    """What a launch gave back: every rank's return value and output, and rank 0's plots."""

    results: list[Any]
    outputs: list[str]
    backend: str
    seconds: float
    figures: list[bytes] = field(default_factory=list)  # rank 0's plots, as PNG

    @property
    def result(self) -> Any:
        """Rank 0's return value."""
        return self.results[0]

    def __repr__(self) -> str:
        return (
            f"Launched({len(self.results)} processes on {self.backend}, {self.seconds:.1f} s; "
            f"rank 0 returned {self.result!r})"
        )


AUTOGRAD_FORK_HINT = (
    "(This process ran a backward pass before it forked the ranks, with a GPU or the lab's "
    "stand-in devices present: that starts autograd's threads, which a forked process cannot "
    "use. Restart the kernel and run backward passes only inside the launched functions.)"
)


class LaunchError(RuntimeError):
    """A launch that did not end well; `rank` names the process that stopped it (None when
    several did), `outputs` holds what every rank printed, and `results` what the ranks whose
    function had returned (`finished`) returned, by rank."""

    def __init__(
        self,
        message: str,
        rank: int | None,
        outputs: list[str],
        finished: list[int] = (),
        results: dict[int, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.outputs = outputs
        self.finished = list(finished)  # ranks whose function had returned
        self.results = dict(results or {})


class LaunchSkipped(BaseException):
    """Raised by `launch` inside `launches_skipped()`: the caller does not run its processes."""


_skipping = [False]


@contextlib.contextmanager
def launches_skipped() -> Iterator[None]:
    """Make every `launch` in the block raise LaunchSkipped instead of starting processes:
    loading a notebook to grade it runs its definitions, not its demos and training runs,
    however deep in a helper function the launch is."""
    before = _skipping[0]
    _skipping[0] = True
    try:
        yield
    finally:
        _skipping[0] = before


class RankFailed(LaunchError):
    """A rank raised an exception, or its process died."""


class GroupNotFormed(RuntimeError):
    """The ranks could not form their process group (gloo's connections between them failed,
    which a machine busy enough has made happen): the function has not run."""


class RanksHung(LaunchError):
    """Ranks waited for each other with no end in sight: computed nothing for too long."""


class RanksTimedOut(LaunchError):
    """The ranks ran past the time or processor-time limit while still computing."""


class GroupStopped(LaunchError):
    """A group stopped before its end because a group before it in the same call had failed
    (see `launch_each`'s `stop_after_failure`)."""


def choose_backend(nprocs: int, backend: str | None = None) -> str:
    """Return "nccl" when `nprocs` GPUs are there for the asking (one per rank), else "gloo"."""
    if backend in ("gloo", "nccl"):
        return backend
    if backend not in (None, "auto"):
        raise ValueError(f'backend must be "gloo", "nccl" or "auto", not {backend!r}')
    usable = torch.cuda.is_available() and torch.distributed.is_nccl_available()
    return "nccl" if usable and torch.cuda.device_count() >= nprocs else "gloo"


def local_device() -> torch.device:
    """Return this rank's device: GPU `LOCAL_RANK` where the group runs on NCCL, else the CPU
    (gloo). Call it in a process of a group (under launch or torchrun)."""
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def time_allreduce(
    allreduce: Callable[[torch.Tensor], Any], sizes: list[int], repeats: int = 5
) -> list[float]:
    """In every rank of a group: return, for each size in bytes, the seconds one call of
    `allreduce(tensor)` takes on a float32 tensor of that size (the median of `repeats`
    calls, each the slowest rank's time). Every rank gets the same list."""
    device = local_device()
    seconds = []
    for size in sizes:
        tensor = torch.zeros(max(1, size // 4), device=device)  # zeros: sums never overflow
        allreduce(tensor)  # a first call sets up connections and buffers
        times = []
        for _ in range(repeats):
            torch.distributed.barrier()
            start = time.perf_counter()
            allreduce(tensor)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            took = torch.tensor([time.perf_counter() - start], device=device)
            torch.distributed.all_reduce(took, op=torch.distributed.ReduceOp.MAX)
            times.append(float(took))
        seconds.append(sorted(times)[len(times) // 2])
    return seconds


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """Return an all-reduce's bus bandwidth in GB/s, as nccl-tests reports it: the data size
    over the time, times 2 (N - 1) / N, the share of the data each rank sends in a ring."""
    return nbytes / seconds / 1e9 * 2 * (world_size - 1) / world_size


# ---- inside a rank -------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Return `value` with every tensor on the CPU, so the parent never touches a GPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _quiet_notebook_parts() -> None:
    """Keep a forked rank away from the notebook's connection: plots go to files."""
    from dplab import plot

    plot.HEADLESS = True
    pyplot = sys.modules.get("matplotlib.pyplot")
    # A pyplot that loads when first used (the grader's loader gives one), not used yet,
    # needs no switch: switching would load it, in every rank.
    if pyplot is not None and type(pyplot).__name__ != "_LazyModule":
        pyplot.switch_backend("Agg")


def _one_run(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    rank: int,
    world: int,
    backend: str,
    folder: Path,
    init_timeout: float,
) -> int:
    """In a rank: join a new group that meets in `folder`, call fn and leave its result (or
    its error) there, then wait for every rank to finish. Return 0, or 1 if fn raised."""
    try:
        log = os.open(folder / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        if faulthandler.is_enabled():  # a crash's stack goes to this rank's log, not the parent's
            faulthandler.enable(file=sys.stderr, all_threads=False)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        stacks = open(folder / f"rank{rank}.stack", "w")  # noqa: SIM115  (open until exit)
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=False)
        # A rank that runs Python when asked (sleeping in time.sleep, say) is not blocked in
        # torch.distributed: the parent asks before it calls a quiet group deadlocked early.
        awake = str(folder / f"rank{rank}.awake")
        signal.signal(signal.SIGUSR2, lambda *_: os.close(os.open(awake, os.O_CREAT, 0o600)))
        figures = folder / f"rank{rank}-figures"
        figures.mkdir()
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            OMP_NUM_THREADS="1",
            DPLAB_FIGURE_DIR=str(figures),
        )
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this machine
        torch.set_num_threads(1)
        _quiet_notebook_parts()
        if backend == "nccl":
            torch.cuda.set_device(rank)
        store = torch.distributed.FileStore(str(folder / "store"), world)
        try:
            with _backend_plugins_known():
                torch.distributed.init_process_group(
                    backend,
                    store=store,
                    rank=rank,
                    world_size=world,
                    timeout=timedelta(seconds=init_timeout),
                )
        except Exception as error:
            raise GroupNotFormed(str(error)) from error
        result = fn(*args, **kwargs)
        with open(folder / f"rank{rank}.partial", "wb") as f:
            pickle.dump(_plain(result), f)
        os.replace(folder / f"rank{rank}.partial", folder / f"rank{rank}.result")  # whole
        # No rank leaves before all have finished: one that left early would close its
        # connections under the others (still connecting, or sending to it). A rank that
        # skipped a call the others make waits here, and the parent says so.
        store.set(f"finished/{rank}", "1")
        store.wait([f"finished/{r}" for r in range(world)])
        return 0
    except BaseException as error:  # the parent reports it, naming this rank
        _leave_error(folder, rank, error)
        return 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()


# What torch found when it looked for third-party process-group backends, looked up once per
# process (see _backend_plugins_known): "found" holds it once there.
_BACKEND_PLUGINS: dict[str, Any] = {}
PLUGIN_GROUP = "torch.distributed.backends"


def look_up_backend_plugins() -> None:
    """Look up the installed third-party backends now, if not yet done in this process (a
    process that forks ranks does it once for all of them)."""
    import importlib.metadata

    if "found" not in _BACKEND_PLUGINS:
        _BACKEND_PLUGINS["found"] = importlib.metadata.entry_points(group=PLUGIN_GROUP)


@contextlib.contextmanager
def _backend_plugins_known() -> Iterator[None]:
    """While the block runs, torch's search for third-party backends is answered from the
    first search. torch searches the entry points of every installed package each time a
    process group starts: some 150 files read, 6 ms, or 20 ms under the grading fence's
    audit hook, and a grade starts 160 groups. The installed packages do not change meanwhile."""
    import importlib.metadata

    look_up_backend_plugins()
    original = importlib.metadata.entry_points

    def entry_points(**params: Any) -> Any:
        if params == {"group": PLUGIN_GROUP}:
            return _BACKEND_PLUGINS["found"]
        return original(**params)

    importlib.metadata.entry_points = entry_points
    try:
        yield
    finally:
        importlib.metadata.entry_points = original


def _leave_error(folder: Path, rank: int, error: BaseException) -> None:
    """Leave the error a rank met where the parent looks for it."""
    trace = traceback.format_exc()
    try:
        with open(folder / f"rank{rank}.error", "wb") as f:
            pickle.dump((type(error).__name__, str(error), trace), f)
    except Exception:
        print(trace, file=sys.__stderr__)


def _run_rank(*arguments: Any) -> None:
    """Body of a forked rank: one run (see `_one_run`), then the process ends."""
    code = 1
    try:
        code = _one_run(*arguments)
    finally:
        os._exit(code)  # the group ends with the process (tearing it down costs 30 ms)


def _serve_rank(
    commands: int,
    ready: int,
    rank: int,
    world: int,
    backend: str,
    init_timeout: float,
    still_clean: Callable | None,
) -> None:
    """Body of a rank that stays (see `RankPool`): run each order read from `commands`, each in
    a new group, mark it done, leave the group, and say so on `ready`; never returns. A rank
    whose function raised ends; so does one that the test made by `still_clean()` (the
    function the pool's `still_clean` returned before the fork) finds changed by the run (the
    test returns False: the run stands; it raises: the run fails with its error)."""
    code = 1
    try:
        clean = still_clean() if still_clean is not None else (lambda: True)
        while True:
            order = _read_order(commands)
            if order is None:  # the pool has closed
                code = 0
                break
            folder, fn, args, kwargs = Path(order[0]), *order[1:]
            code = _one_run(fn, args, kwargs, rank, world, backend, folder, init_timeout)
            if code:
                break
            try:
                reusable = clean()
            except Exception as error:
                _leave_error(folder, rank, error)
                code = 1
                break
            # "done", or "last" for a rank that stands down (the next order goes to new ranks)
            (folder / f"rank{rank}.{'done' if reusable else 'last'}").touch()
            if not reusable:
                code = 0
                break
            if torch.distributed.is_initialized():  # after the run: it cannot hold the run up
                torch.distributed.destroy_process_group()
            os.write(ready, b"r")
    finally:
        os._exit(code)


def _read_order(fd: int) -> tuple | None:
    """Read one order (a length, then a pickle) from `fd`; None at its end."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    body = _read_exactly(fd, int.from_bytes(head, "big"))
    return None if body is None else pickle.loads(body)


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _fork_rank(*arguments: Any, serve: bool = False) -> int:
    """Fork one rank (see `_run_rank`, or `_serve_rank` when it is to stay); return its process
    id. The grading fence lets this function, and no other, start processes
    (grader.sandbox.fence)."""
    pid = os.fork()
    if pid == 0:
        (_serve_rank if serve else _run_rank)(*arguments)
    return pid


# ---- the parent ----------------------------------------------------------------------------


def processor_seconds(pid: int) -> float:
    """Return the processor time process `pid` has used so far (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def describe_status(status: int) -> str:
    """Say in words how a rank's process ended, from its wait status."""
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return {
            "SIGSEGV": "crashed with a segmentation fault",
            "SIGKILL": "was killed (SIGKILL), perhaps for using too much memory",
            "SIGABRT": "aborted",
        }.get(name, f"was killed by {name}")
    return f"exited with code {os.waitstatus_to_exitcode(status)} without a result"


# Files whose frames are the machinery's, not the code being run: a stack shown to the user
# leaves them out (a library that wraps torch.distributed adds its own file here).
LIBRARY_PARTS = [f"{os.sep}torch{os.sep}", f"dplab{os.sep}distributed.py"]


def _where_from(dump: str, keep: int = 3) -> str:
    """Say where a faulthandler stack dump shows a rank: the torch.distributed call it waits
    in, then its own innermost frames (the library's own frames left out)."""
    frames = [line.strip() for line in dump.splitlines() if line.strip().startswith("File ")]
    inside = [i for i, f in enumerate(frames) if f.endswith(" in _run_rank")]
    frames = frames[: inside[0]] if inside else frames  # what lies under fn is the launcher's
    if not frames:
        return ""
    waiting = ""
    if "distributed" in frames[0] and " in " in frames[0]:
        waiting = f"waiting in torch.distributed's {frames[0].rsplit(' in ', 1)[1]}, called from "
    own = [f for f in frames if not any(part in f for part in LIBRARY_PARTS)][:keep]
    return waiting + ("; from ".join(own) if own else frames[0])


class _Group:
    """The parent's view of the ranks of one launch."""

    def __init__(self, folder: Path, pids: list[int], show: bool) -> None:
        self.folder, self.pids, self.show = folder, pids, show
        self.status: dict[int, int] = {}  # rank -> wait status, once it has ended
        self.ended: list[int] = []  # ranks in the order they ended
        self.ended_at: dict[int, float] = {}  # when the parent found each one ended
        self.read = [0] * len(pids)  # bytes of each rank's log shown so far
        self.partial = [""] * len(pids)
        self.seen: dict[tuple[int, str], tuple] = {}  # (rank, thread) -> schedstat (see demand)
        self.demanded, self.demand_at = 0.0, 0.0

    def reap(self) -> None:
        for rank, pid in enumerate(self.pids):
            if rank not in self.status:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.status[rank] = status
                    self.ended.append(rank)
                    self.ended_at[rank] = time.time()

    @property
    def running(self) -> list[int]:
        return [r for r in range(len(self.pids)) if r not in self.status]

    def failed(self) -> list[int]:
        """Return the ranks that ended badly, the cause first: a rank whose peer went away
        (its connection closed) failed because of another, which comes before it; otherwise
        the first to fail (when it wrote its error, or was found dead) comes first."""
        bad = [r for r in self.ended if self.status[r] != 0]

        def order(r: int) -> tuple[bool, float]:
            path = self.folder / f"rank{r}.error"
            try:
                text = path.read_bytes()
                return (any(p in text for p in PEER_GONE), path.stat().st_mtime)
            except OSError:
                return (False, self.ended_at[r])

        return sorted(bad, key=order)

    def finished(self) -> list[int]:
        return sorted(r for r in self.ended if self.status[r] == 0)

    def cpu(self) -> float:
        return sum(processor_seconds(self.pids[r]) for r in self.running)

    def output(self, rank: int) -> str:
        try:
            return (self.folder / f"rank{rank}.log").read_text(errors="replace")
        except OSError:
            return ""

    def stream(self) -> None:
        """Print what the ranks wrote since last time, a line at a time, behind [rank r]."""
        if not self.show:
            return
        for rank in range(len(self.pids)):
            text = self.output(rank)
            new, self.read[rank] = text[self.read[rank] :], len(text)
            lines = (self.partial[rank] + new).split("\n")
            self.partial[rank] = lines.pop()
            for line in lines:
                print(f"[rank {rank}] {line}", flush=True)

    def flush(self) -> None:
        self.stream()
        for rank, rest in enumerate(self.partial):
            if rest and self.show:
                print(f"[rank {rank}] {rest}", flush=True)
            self.partial[rank] = ""

    def demand(self) -> float:
        """Return the seconds the running ranks' threads have run or waited to run, added up
        since this group's first call. From the kernel's schedstat: time on a processor and
        time waiting for one (a busy machine keeps ranks waiting: that counts as wanting to
        run). The kernel adds a wait when the thread gets a processor, so a thread found
        runnable that has not run since the last call, kept waiting all along, counts as
        wanting to run since then; so does one held up otherwise (in a disk wait, or
        stopped). Threads count from when they are first seen."""
        now = time.monotonic()
        since_last, self.demand_at = now - (self.demand_at or now), now
        for r in self.running:
            try:
                tasks = os.listdir(f"/proc/{self.pids[r]}/task")
            except OSError:
                continue
            for task in tasks:
                folder = f"/proc/{self.pids[r]}/task/{task}"
                try:
                    with open(f"{folder}/schedstat", "rb") as f:
                        on_cpu, queued, runs = f.read().split()[:3]
                    with open(f"{folder}/stat", "rb") as f:
                        stat = f.read()
                except (OSError, ValueError):
                    continue
                used = (int(on_cpu) + int(queued)) / 1e9
                last_used, last_runs = self.seen.get((r, task), (0.0, None))
                self.demanded += used - last_used
                self.seen[(r, task)] = (used, runs)
                state = stat[stat.rindex(b")") + 2 :][:1]
                if state in (b"D", b"T", b"t") or (state == b"R" and runs == last_runs):
                    self.demanded += since_last
        return self.demanded

    def ask_awake(self, ranks: list[int]) -> None:
        """Ask `ranks` to run a line of Python (see `answered`)."""
        for r in ranks:
            with contextlib.suppress(OSError):
                os.remove(self.folder / f"rank{r}.awake")
            with contextlib.suppress(OSError):
                os.kill(self.pids[r], signal.SIGUSR2)

    def answered(self, ranks: list[int]) -> bool:
        """Return True if one of `ranks` has run Python since `ask_awake`: a rank blocked in
        a call into torch.distributed's C++ cannot until the call returns."""
        return any((self.folder / f"rank{r}.awake").exists() for r in ranks)

    def where(self) -> dict[int, str]:
        """Ask every running rank for its stack (faulthandler); say where each one is."""
        for r in self.running:
            with contextlib.suppress(OSError):
                os.kill(self.pids[r], signal.SIGUSR1)
        # faulthandler writes from its signal handler, at once: wait until every rank's stack
        # is there and has stopped growing (at most STACK_SECONDS, for a rank that never writes).
        deadline, sizes = time.monotonic() + STACK_SECONDS, None
        while time.monotonic() < deadline:
            time.sleep(0.01)
            now = [self._stack_size(r) for r in self.running]
            if now == sizes and all(now):
                break
            sizes = now
        found = {}
        for r in self.running:
            try:
                found[r] = _where_from((self.folder / f"rank{r}.stack").read_text())
            except OSError:
                found[r] = ""
        return found

    def _stack_size(self, rank: int) -> int:
        try:
            return os.stat(self.folder / f"rank{rank}.stack").st_size
        except OSError:
            return 0

    def kill(self) -> None:
        for r in self.running:
            with contextlib.suppress(OSError):
                os.kill(self.pids[r], signal.SIGKILL)
        for r in self.running:
            _, self.status[r] = os.waitpid(self.pids[r], 0)

    def stop(
        self, error: type[LaunchError], message: str, rank: int | None = None, finished=()
    ) -> LaunchError:
        """Stop the ranks still running; return `error` with what every rank printed, and
        what the `finished` ranks returned."""
        self.kill()
        self.flush()
        outputs = [self.output(r) for r in range(len(self.pids))]
        return error(message, rank, outputs, finished, self.results_of(finished))

    def returned(self, rank: int) -> bool:
        """Return True when rank's function has returned (it waits for the others then)."""
        return (self.folder / f"rank{rank}.result").exists()

    def results_of(self, ranks: list[int]) -> dict[int, Any]:
        """Return what each of `ranks` left as its function's result, where it left one."""
        results = {}
        for r in ranks:
            with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
                with open(self.folder / f"rank{r}.result", "rb") as f:
                    results[r] = pickle.load(f)
        return results

    def error_of(self, rank: int) -> str:
        path = self.folder / f"rank{rank}.error"
        if path.exists():
            with open(path, "rb") as f:
                kind, message, trace = pickle.load(f)
            return f"rank {rank} raised {kind}: {message}\n{trace.rstrip()}"
        lines = self.output(rank).strip().splitlines()
        # A library that aborts says why in a line of its own ("what(): ..."), which the stack
        # that Python's fault handler writes after it would push out of the last lines.
        why = [i for i, line in enumerate(lines) if line.lstrip().startswith("what():")]
        said = "\n".join(lines[max(0, why[-1] - 1) : why[-1] + 1] if why else lines[-6:])
        return f"rank {rank}'s process {describe_status(self.status[rank])}" + (
            f"; the last lines it wrote:\n{said}" if said else ""
        )


# What gloo says when the process at the other end of a connection has gone.
PEER_GONE = (b"Connection closed by peer", b"Connection reset by peer", b"Read error")
IDLE_SHARE = 0.05  # ranks that use less than this share of one core are waiting, not computing
# Ranks whose threads have neither run nor waited for a processor for this long (a busy machine
# keeps them waiting), and that run no Python when asked to, wait inside torch.distributed for
# each other: a deadlock, called before idle_timeout.
QUIET_SECONDS = 0.6
ANSWER_SECONDS = 0.2  # how long a rank has to answer (a Python signal handler runs at once)
DEMAND_SECONDS = 0.1  # how often the parent reads what the waiting ranks' threads are doing
STACK_SECONDS = 0.3  # the longest a deadlocked rank is given to write its stack (see where)


def _quiet(then: tuple[float, float, float], later: tuple[float, float, float]) -> bool:
    """Return True if, between two readings (wall clock, demand, processor time), the ranks
    computed next to nothing and their threads hardly wanted to run (see _Group.demand)."""
    most = IDLE_SHARE * (later[0] - then[0])
    return later[2] - then[2] < most and later[1] - then[1] < most


def _accelerator_here() -> bool:
    """Return True if this machine has an NVIDIA or AMD GPU (a rank may wait for one, asleep,
    computing nothing on the processor): then only idle_timeout calls ranks deadlocked."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


def _parent_waits(
    group: _Group, nprocs: int, timeout: float, idle_timeout: float, cpu_limit: float | None
) -> Iterator[None]:
    """Watch the ranks until all have ended well; raise a LaunchError naming who did not.
    A generator: it yields whenever the caller should wait a moment and look again, so that
    one caller can watch several groups at once."""
    started = time.monotonic()
    readings: list[tuple[float, float]] = []  # (wall clock, processor time of the ranks)
    grace_until = None  # after a rank fails, the others get a moment to fail by themselves
    early = bool(idle_timeout) and idle_timeout > QUIET_SECONDS and not _accelerator_here()
    demands: list[tuple[float, float, float]] = []  # (wall clock, demand, processor time)
    asked = None  # when the waiting ranks were asked to answer, and the reading quiet since
    while True:
        group.reap()
        group.stream()
        now = time.monotonic()
        if not group.running:
            break
        if group.failed() and grace_until is None:
            grace_until = now + 2.0
        if grace_until is not None and now > grace_until:
            break
        cpu = group.cpu()
        readings.append((now, cpu))
        # Waiting ranks are not quite still (a library may wake up now and then): they are
        # stuck when, over the last idle_timeout seconds, they computed next to nothing.
        while len(readings) > 2 and readings[1][0] <= now - idle_timeout:
            readings.pop(0)
        window_start, cpu_then = readings[0]
        stuck = (
            idle_timeout
            and now - window_start >= idle_timeout
            and cpu - cpu_then < IDLE_SHARE * (now - window_start)
        )
        quiet_for = idle_timeout
        if early and not stuck and grace_until is None:
            # The readings of the last QUIET_SECONDS, and the one just before them.
            if not demands or now - demands[-1][0] >= DEMAND_SECONDS:
                demands.append((now, group.demand(), cpu))
            while len(demands) > 2 and demands[1][0] <= now - QUIET_SECONDS:
                demands.pop(0)
            waiting = [r for r in group.running if not group.returned(r)]
            if not waiting:
                asked = None
            elif asked is None:
                if now - demands[0][0] >= QUIET_SECONDS and _quiet(demands[0], demands[-1]):
                    group.ask_awake(waiting)
                    asked = (now, demands[0])
            elif now - asked[0] >= ANSWER_SECONDS:
                if group.answered(waiting):
                    early = False  # it sleeps in Python (time.sleep): idle_timeout decides
                elif _quiet(asked[1], (now, group.demand(), cpu)):
                    stuck, quiet_for = True, now - asked[1][0]
                else:
                    asked = None
        if cpu_limit and cpu > cpu_limit:
            raise group.stop(
                RanksTimedOut,
                f"the {nprocs} processes used more than {cpu_limit:.3g} s of processor time "
                "between them and were stopped",
            )
        if stuck and grace_until is None and all(group.returned(r) for r in range(nprocs)):
            # Every rank's function has returned, so none waits for the code any more: what
            # is left (the ranks' last wait for each other, then leaving) is the launcher's
            # own, and a machine busy enough can stall it. The results are whole: take them.
            group.kill()
            group.status.update(dict.fromkeys(range(nprocs), 0))
            break
        if stuck and grace_until is None:
            stacks = group.where()
            done = [r for r in range(nprocs) if group.returned(r)]
            waiting = [r for r in range(nprocs) if r not in done]
            lines = [
                f"rank {r} computed nothing for {round(quiet_for, 1):g} s and had not finished"
                + (f": {stacks[r]}" if stacks.get(r) else "")
                for r in waiting
            ]
            if done:
                lines.append(
                    f"rank(s) {', '.join(map(str, done))} had returned, and waited for the "
                    "others to return too"
                )
            why = (
                "a rank skipped a call that the others made, so they wait for it"
                if done
                else "the ranks are waiting for each other (a deadlock): for example every "
                "rank doing a blocking send first"
            )
            rank = waiting[0] if len(waiting) == 1 else None
            raise group.stop(RanksHung, why + ".\n  " + "\n  ".join(lines), rank, done)
        if timeout and now - started > timeout:
            raise group.stop(
                RanksTimedOut,
                f"the {nprocs} processes ran past the limit of {timeout:g} s and were stopped",
            )
        yield
    if group.running:
        group.kill()
    group.flush()
    failed = group.failed()
    if failed:
        first, others = failed[0], sorted(failed[1:] + group.running)
        message = group.error_of(first)
        if "autograd's threading in combination with fork" in message:
            message += "\n" + AUTOGRAD_FORK_HINT
        if others:
            message += f"\n(then rank(s) {', '.join(map(str, others))} stopped as well)"
        finished = group.finished()
        if finished:
            message += (
                f"\n(rank(s) {', '.join(map(str, finished))} had finished: a rank that "
                "skips a collective or a send leaves the others waiting for it)"
            )
        outputs = [group.output(r) for r in range(nprocs)]
        returned = [r for r in range(nprocs) if group.returned(r)]
        raise RankFailed(message, first, outputs, returned, group.results_of(returned))


def _show_figures(figures: list[bytes]) -> None:
    from dplab.plot import _in_notebook

    if figures and _in_notebook():
        from IPython.display import Image, display

        for png in figures:
            display(Image(data=png, format="png"))


@contextlib.contextmanager
def _launch_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="dplab-launch-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _check_arguments(fn: Callable, args: tuple, nprocs: int, backend: str | None) -> str:
    """Refuse what cannot be launched, saying why; return the backend to use."""
    if _skipping[0]:
        raise LaunchSkipped(getattr(fn, "__name__", "the function"))
    if not callable(fn):
        raise TypeError(f"launch needs a function to run in every process, not {fn!r}")
    if not isinstance(nprocs, int) or not 1 <= nprocs <= MAX_PROCESSES:
        raise ValueError(f"nprocs must be a whole number from 1 to {MAX_PROCESSES}, not {nprocs!r}")
    if not isinstance(args, tuple | list):
        raise TypeError(f"args must be a tuple of fn's arguments, not {type(args).__name__}")
    chosen = choose_backend(nprocs, backend)
    if chosen == "nccl" and torch.cuda.is_initialized():
        raise RuntimeError(
            "this process has already used CUDA, and forked processes cannot use it after "
            "that: restart the kernel and launch before any CUDA code runs here, or pass "
            'backend="gloo"'
        )
    if torch.distributed.is_initialized():
        raise RuntimeError("launch starts its own process group: call it outside of one")
    # Every torch.optim optimizer imports torch._dynamo (over a second): import it here, once,
    # so that the ranks, forked afresh at each launch, find it already loaded.
    importlib.import_module("torch._dynamo")
    return chosen


def _start(
    fn: Callable,
    args: tuple,
    kwargs: dict | None,
    nprocs: int,
    backend: str,
    folder: Path,
    store_timeout: float,
    show: bool,
) -> _Group:
    """Fork the ranks of one group; return the parent's view of them."""
    sys.stdout.flush()
    sys.stderr.flush()
    pids: list[int] = []
    with warnings.catch_warnings():  # a notebook's kernel has threads; ranks ignore them
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            for rank in range(nprocs):
                pids.append(
                    _fork_rank(
                        fn, tuple(args), dict(kwargs or {}), rank, nprocs, backend, folder,
                        store_timeout,
                    )
                )  # fmt: skip
        except BaseException:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            raise
    return _Group(folder, pids, show)


def _results(group: _Group, backend: str, started: float) -> Launched:
    """Read back what the ranks of a group that ended well left."""
    results = []
    for rank in range(len(group.pids)):
        with open(group.folder / f"rank{rank}.result", "rb") as f:
            results.append(pickle.load(f))
    figures = [p.read_bytes() for p in sorted((group.folder / "rank0-figures").glob("*.png"))]
    outputs = [group.output(r) for r in range(len(group.pids))]
    return Launched(results, outputs, backend, time.monotonic() - started, figures)


def _pause(started: float) -> None:
    # Most groups of the checks finish within a fraction of a second: look often then.
    time.sleep(0.005 if time.monotonic() - started < 1.0 else 0.02)


def launch(
    fn: Callable,
    args: tuple = (),
    kwargs: dict | None = None,
    nprocs: int = 2,
    backend: str | None = None,
    timeout: float = 3600.0,
    idle_timeout: float = 60.0,
    cpu_limit: float | None = None,
    show: bool = True,
) -> Launched:
    """Run `fn(*args, **kwargs)` in every process of a new group of `nprocs` on this machine.

    `backend` is "gloo", "nccl" or None (NCCL when there is a GPU per process); `timeout`
    bounds the run in seconds, `idle_timeout` the time all ranks may compute nothing (a
    deadlock), and `cpu_limit` their processor time together. `show` prints each rank's
    output as it comes and shows rank 0's plots. See the module docstring.
    """
    chosen = _check_arguments(fn, args, nprocs, backend)
    started = time.monotonic()
    store_timeout = max(2 * idle_timeout, 30.0) if idle_timeout else timeout
    with _launch_folder() as folder:
        group = _start(fn, args, kwargs, nprocs, chosen, folder, store_timeout, show)
        try:
            for _ in _parent_waits(group, nprocs, timeout, idle_timeout, cpu_limit):
                _pause(started)
        except BaseException:  # Ctrl-C in the notebook stops every rank too
            group.kill()
            raise
        done = _results(group, chosen, started)
    if show:
        _show_figures(done.figures)
    return done


def launch_each(
    calls: list[tuple[Callable, int]],
    backend: str | None = None,
    timeout: float = 3600.0,
    idle_timeout: float = 60.0,
    cpu_limit: float | None = None,
    stop_after_failure: bool = False,
) -> list[Launched | LaunchError]:
    """Run several groups side by side: for each (fn, nprocs) in `calls`, `fn()` in every
    process of a group of its own, as `launch` does (quietly). Return, in order, what each
    launch returned, or the LaunchError that ended it: one group's failure ends no other,
    unless `stop_after_failure`: then it stops the groups after it in `calls` that are still
    running (their outcome is a GroupStopped), for a caller that reads the outcomes in order
    up to the first failure. Groups that mostly wait (the checks' tiny cases) take little
    longer together than the largest alone."""

    def begin(fn: Callable, nprocs: int, chosen: str, folder: Path, store_timeout: float):
        return _start(fn, (), None, nprocs, chosen, folder, store_timeout, False)

    return _side_by_side(
        calls, backend, timeout, idle_timeout, cpu_limit, begin, stop_after_failure
    )


def _side_by_side(
    calls: list[tuple[Callable, int]],
    backend: str | None,
    timeout: float,
    idle_timeout: float,
    cpu_limit: float | None,
    begin: Callable[..., "_Group"],
    stop_after_failure: bool = False,
) -> list[Launched | LaunchError]:
    """Run each (fn, nprocs) of `calls` in a group of its own, side by side, and watch them all
    (see `launch_each`, and its `stop_after_failure`). `begin(fn, nprocs, backend, folder,
    store_timeout)` starts one group's run in `folder` and returns the parent's view of it."""
    chosen = [_check_arguments(fn, (), nprocs, backend) for fn, nprocs in calls]
    started = time.monotonic()
    store_timeout = max(2 * idle_timeout, 30.0) if idle_timeout else timeout
    outcomes: list[Launched | LaunchError | None] = [None] * len(calls)
    with contextlib.ExitStack() as stack:
        groups: list[_Group] = []
        watchers = {}
        try:
            for i, ((fn, nprocs), backend_i) in enumerate(zip(calls, chosen, strict=True)):
                folder = stack.enter_context(_launch_folder())
                groups.append(begin(fn, nprocs, backend_i, folder, store_timeout))
                watchers[i] = _parent_waits(groups[i], nprocs, timeout, idle_timeout, cpu_limit)
            while watchers:
                for i, watcher in list(watchers.items()):
                    if i not in watchers:  # stopped meanwhile
                        continue
                    try:
                        next(watcher)
                    except StopIteration:
                        outcomes[i] = _results(groups[i], chosen[i], started)
                        del watchers[i]
                    except LaunchError as error:
                        outcomes[i] = error
                        del watchers[i]
                        # A group that could not form has run nothing, and decides nothing
                        # (a pool runs it again: see RankPool.run_each).
                        if stop_after_failure and not _not_formed(error):
                            for j in [j for j in watchers if j > i]:
                                watchers.pop(j).close()
                                outcomes[j] = groups[j].stop(
                                    GroupStopped,
                                    f"the group of {calls[j][1]} processes was stopped: the "
                                    f"group of {calls[i][1]} before it had failed",
                                    finished=[
                                        r for r in range(calls[j][1]) if groups[j].returned(r)
                                    ],
                                )
                if watchers:
                    _pause(started)
        except BaseException:
            for group in groups:
                group.kill()
            raise
    return outcomes  # type: ignore[return-value]


# ---- ranks that stay -----------------------------------------------------------------------


class _Ranks:
    """The processes of one group that stay, and the pipes their orders go down."""

    def __init__(self, pids: list[int], pipes: list[int], readies: list[int], key: object) -> None:
        self.pids, self.pipes, self.readies, self.key = pids, pipes, readies, key
        self.broken = False  # a rank has ended, or was stopped: no more orders
        self.busy = False  # an order was sent, and not every rank has said it is ready since

    def ready(self, timeout: float) -> bool:
        """Return True once every rank has left the last order's group (waiting at most
        `timeout` seconds for them), False if one has not."""
        deadline = time.monotonic() + timeout
        for fd in self.readies if self.busy else []:
            waiting, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not waiting or os.read(fd, 1) != b"r":
                return False
        self.busy = False
        return True

    def alive(self) -> bool:
        if not self.broken:
            for pid in self.pids:
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        self.broken = True
        return not self.broken

    def close(self) -> None:
        for fd in self.pipes + self.readies:
            with contextlib.suppress(OSError):
                os.close(fd)
        for pid in self.pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in self.pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.pids, self.pipes, self.readies, self.broken = [], [], [], True


class _Order(_Group):
    """The parent's view of one order carried out by ranks that stay: a rank has ended when
    it has marked the order done, or when its process has died."""

    def __init__(self, folder: Path, ranks: _Ranks) -> None:
        super().__init__(folder, ranks.pids, show=False)
        self.ranks = ranks
        self.cpu_before = [processor_seconds(pid) for pid in ranks.pids]

    def reap(self) -> None:
        for rank, pid in enumerate(self.pids):
            if rank in self.status:
                continue
            if (self.folder / f"rank{rank}.done").exists():
                status = 0
            elif (self.folder / f"rank{rank}.last").exists():
                status = 0
                self.ranks.broken = True
            else:
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done, status = pid, 1 << 8
                if not done:
                    continue
                self.ranks.broken = True
                if status == 0:  # it left without marking the order done
                    status = 1 << 8
            self.status[rank] = status
            self.ended.append(rank)
            self.ended_at[rank] = time.time()

    def cpu(self) -> float:
        return sum(
            max(0.0, processor_seconds(self.pids[r]) - self.cpu_before[r]) for r in self.running
        )

    def kill(self) -> None:
        running = self.running
        self.ranks.close()  # the others wait on the killed ones: none of them can go on
        for r in running:
            self.status.setdefault(r, signal.SIGKILL)


def _not_formed(outcome: "Launched | LaunchError") -> bool:
    """Return True for a run whose ranks failed to form their group (see GroupNotFormed)."""
    return isinstance(outcome, RankFailed) and f"raised {GroupNotFormed.__name__}:" in str(outcome)


class RankPool:
    """Groups whose processes stay for many runs, one group per size: what `launch_each`
    does, without forking afresh for each run.

    Forking a process that has imported torch costs some 30 ms of processor time, and its
    first steps more; a grader that runs many small cases in groups of 2, 3 and 4 processes
    spends most of its time there. A pool forks each size's ranks at its first run and sends
    them every later run. Each run is still a group of its own (a new process group, in a new
    folder), and a run ends as under `launch_each`, with the same errors. Ranks that failed,
    were stopped, or were changed by a run are not used again: the next run forks new ones
    (`still_clean`, called here before a group's ranks are forked, returns what each of them
    calls right after its fork, which returns the test that says so; what the test compares
    with is read once, here, rather than in every rank, where reading it copies the pages the
    rank shares with this process). So are
    ranks forked under another `key` (say, what the forking process held then), and ranks
    that have not left their last run's group within `ready_seconds` when the next run comes.

    Functions and arguments sent to ranks that were already there must pickle: module-level
    functions (or `functools.partial` of them) and plain data. Close the pool when done.
    """

    def __init__(
        self,
        still_clean: Callable[[], Callable[[], Callable[[], bool]]] | None = None,
        ready_seconds: float = 5.0,
    ) -> None:
        self.still_clean = still_clean
        self.ready_seconds = ready_seconds
        self.groups: dict[int, _Ranks] = {}
        self.forks = 0  # ranks forked so far
        self.formed_again: list[int] = []  # the sizes of the runs done again (see run_each)

    def _ranks(self, nprocs: int, backend: str, key: object, store_timeout: float) -> _Ranks:
        ranks = self.groups.get(nprocs)
        # Ranks that have not left their last group within `ready_seconds` are not waited for:
        # new ones are forked (the last run had ended well: the ranks owe nothing to it).
        if ranks is not None and ranks.key == key and ranks.alive():
            if ranks.ready(self.ready_seconds):
                return ranks
        if ranks is not None:
            ranks.close()
        sys.stdout.flush()
        sys.stderr.flush()
        forked = _Ranks([], [], [], key)
        in_rank = self.still_clean() if self.still_clean is not None else None
        try:
            for rank in range(nprocs):
                order_read, order_write = os.pipe()
                ready_read, ready_write = os.pipe()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", DeprecationWarning)
                        pid = _fork_rank(
                            order_read, ready_write, rank, nprocs, backend, store_timeout,
                            in_rank, serve=True,
                        )  # fmt: skip
                finally:
                    os.close(order_read)
                    os.close(ready_write)
                forked.pids.append(pid)
                forked.pipes.append(order_write)
                forked.readies.append(ready_read)
                self.forks += 1
        except BaseException:
            forked.close()
            raise
        self.groups[nprocs] = forked
        return forked

    def _send(self, ranks: _Ranks, folder: Path, fn: Callable) -> _Order:
        order = pickle.dumps((str(folder), fn, (), {}))
        ranks.busy = True
        try:
            for fd in ranks.pipes:
                os.write(fd, len(order).to_bytes(8, "big") + order)
        except OSError:  # a rank has gone since: these ranks are done
            ranks.broken = True
        return _Order(folder, ranks)

    def run_each(
        self,
        calls: list[tuple[Callable, int]],
        key: object = None,
        backend: str | None = None,
        timeout: float = 3600.0,
        idle_timeout: float = 60.0,
        cpu_limit: float | None = None,
        stop_after_failure: bool = False,
    ) -> list[Launched | LaunchError]:
        """As `launch_each`, on this pool's ranks (forked now where there are none for a size,
        or none forked under `key`); each size at most once per call."""
        if len({nprocs for _, nprocs in calls}) < len(calls):
            raise ValueError("a pool runs one group of each size at a time")

        def begin(fn: Callable, nprocs: int, chosen: str, folder: Path, store_timeout: float):
            ranks = self._ranks(nprocs, chosen, (key, chosen), store_timeout)
            return self._send(ranks, folder, fn)

        try:
            limits = (timeout, idle_timeout, cpu_limit, begin, stop_after_failure)
            done = _side_by_side(calls, backend, *limits)
            # A group that could not form has run nothing: once more, on ranks forked anew
            # (those whose run failed serve no more).
            again = [i for i, d in enumerate(done) if _not_formed(d)]
            if again:
                redone = _side_by_side([calls[i] for i in again], backend, *limits)
                for i, outcome in zip(again, redone, strict=True):
                    done[i] = outcome
                    self.formed_again.append(calls[i][1])
            return done
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop every rank of the pool."""
        for ranks in self.groups.values():
            ranks.close()
        self.groups.clear()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
