"""What a launch gives back: every rank's result and output, or the error that stopped the
group, naming the rank."""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from labtext import N_, _


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
        return _(
            "Launched({n} processes on {backend}, {seconds} s; rank 0 returned {result})"
        ).format(
            n=len(self.results),
            backend=self.backend,
            seconds=f"{self.seconds:.1f}",
            result=repr(self.result),
        )


AUTOGRAD_FORK_HINT = N_(
    "(This process ran a backward pass before it forked the ranks, with a GPU or the lab's "
    "stand-in devices present: that starts autograd's threads, which a forked process cannot "
    "use. Restart the kernel and run backward passes only inside the launched functions.)"
)


class LaunchError(RuntimeError):
    """A launch that did not end well; `rank` names the process that stopped it (None when
    several did), `outputs` holds what every rank printed, and `results` what the ranks whose
    function had returned (`finished`) returned, by rank. `raised` is the name of the
    exception that the rank to blame raised, where it raised one (the message says it in the
    reader's language: test this instead). `cause` tells what stopped the group from other
    causes, without what differs from one run to the next (how long the ranks idled)."""

    def __init__(
        self,
        message: str,
        rank: int | None,
        outputs: list[str],
        finished: list[int] = (),
        results: dict[int, Any] | None = None,
        raised: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.outputs = outputs
        self.finished = list(finished)  # ranks whose function had returned
        self.results = dict(results or {})
        self.raised = raised
        self.cause = ""

    def _render_traceback_(self) -> list[str]:
        """What a notebook shows (IPython asks for it): the error alone, with the student's
        cells named as JupyterLab names them; the launcher's own frames would tell nothing."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {in_cells(str(self))}"]


def in_cells(text: str) -> str:
    """Name the notebook's cells in `text` as JupyterLab does (`Cell In[3]`), where it runs in
    an IPython kernel that knows them."""
    try:
        from IPython import get_ipython

        names = dict(get_ipython().compile._filename_map)
    except Exception:  # not in IPython, or an IPython that keeps no such map
        return text
    for filename, number in names.items():
        text = text.replace(f'File "{filename}"', f"Cell In[{number}]")
        text = text.replace(filename, f"Cell In[{number}]")
    return text


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
