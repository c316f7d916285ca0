"""The processor-time limit of a case or a statement, and the error that stops it."""

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

import torch

from labtext import _


class TimeLimit(BaseException):
    """Raised in the student's code when a case has used up its processor time.

    It derives from BaseException so that a student's `except Exception:` does not swallow it.
    """


def own_processor_seconds() -> float:
    """Return the processor time this process has used, all its threads together."""
    return time.process_time()


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise TimeLimit in the block once it has used `seconds` of processor time per thread
    (main thread only; None: no limit).

    Processor time, not wall time: a busy machine slows a case down but does not make it
    use more processor time, so a slow machine never stops correct code, while an endless
    loop is stopped whatever else runs. Code that waits without computing (time.sleep) is
    caught by the grader's watch on the child (see grader.grading).
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise TimeLimit(
            _("it ran past the time limit of {seconds} s of processor time per check").format(
                seconds=f"{seconds:g}"
            )
        )

    previous = signal.signal(signal.SIGPROF, stop)
    # Processor time adds up over PyTorch's threads: each of them may use the limit.
    signal.setitimer(signal.ITIMER_PROF, seconds * max(1, torch.get_num_threads()))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
