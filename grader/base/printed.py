"""Catch what one thread prints, and only that thread.

`contextlib.redirect_stdout` swaps `sys.stdout` for the whole process: while a background
thread loads a reference notebook into a buffer, the main thread's own output (a class's
summary, say) would vanish into that buffer too. `captured` swaps in, once, a stream that
sends each thread's writes to that thread's buffer, if it has one, and to the real stream
otherwise; the real stream is back in place once no thread captures.
"""

import contextlib
import io
import os
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

_buffers = threading.local()
_lock = threading.Lock()
_active = [0]  # captures under way, in every thread (kept in place: the grader watches names)


class _PerThread(io.TextIOBase):
    """Stands in for sys.stdout or sys.stderr: writes go to the current thread's buffer,
    where `captured` set one, else to the stream it replaced."""

    def __init__(self, name: str, real: TextIO) -> None:
        super().__init__()
        self.name_in_sys = name
        self.real = real

    def target(self) -> TextIO:
        return getattr(_buffers, self.name_in_sys, None) or self.real

    def write(self, text: str) -> int:
        return self.target().write(text)

    def flush(self) -> None:
        self.target().flush()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return self.target().encoding

    @property
    def errors(self) -> str | None:
        return self.target().errors

    def isatty(self) -> bool:
        return self.target().isatty()

    def fileno(self) -> int:
        return self.target().fileno()

    def __getattr__(self, attribute: str):  # encoding, buffer, reconfigure...
        return getattr(self.target(), attribute)


@contextlib.contextmanager
def captured(into: io.StringIO, stderr: bool = True) -> Iterator[io.StringIO]:
    """Send what this thread prints (to stdout and, with `stderr`, to stderr) into `into`."""
    names = ("stdout", "stderr") if stderr else ("stdout",)
    with _lock:
        _active[0] += 1
        for name in ("stdout", "stderr"):
            current = getattr(sys, name)
            if not isinstance(current, _PerThread):
                setattr(sys, name, _PerThread(name, current))
    before = {name: getattr(_buffers, name, None) for name in names}
    for name in names:
        setattr(_buffers, name, into)
    try:
        yield into
    finally:
        for name, earlier in before.items():
            setattr(_buffers, name, earlier)
        with _lock:
            _active[0] -= 1
            if _active[0] == 0:
                for name in ("stdout", "stderr"):
                    current = getattr(sys, name)
                    if isinstance(current, _PerThread):
                        setattr(sys, name, current.real)


def _after_fork_in_child() -> None:
    """A forked process (a rank, say) starts with no capture: the buffers it inherited are
    copies that nobody reads."""
    _buffers.__dict__.clear()  # the forking thread's, now this process's only thread
    _lock._at_fork_reinit()  # type: ignore[attr-defined]  (held by a thread not copied)
    _active[0] = 0
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if isinstance(current, _PerThread):
            setattr(sys, name, current.real)


def _before_fork() -> None:
    """Send on what this process has printed before a copy of it starts. A forked process (a
    rank, a loader worker) inherits output not yet sent and sends it again when it flushes:
    in a Jupyter kernel, which sends output on a timer, a check cell showed its report once
    per rank forked after it was printed."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _PerThread):
            stream = stream.real  # a capture's buffer is the child's to drop, not to send
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or no stream at all
            pass


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


class ReaderGone(io.TextIOBase):
    """Stands in for sys.stdout in a command: when the program reading its output has gone
    (`| head`), what is left to print goes nowhere, and the command goes on to write its
    reports instead of stopping with BrokenPipeError."""

    def __init__(self, real: TextIO) -> None:
        super().__init__()
        self.real = real
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.real.write(text)
            except BrokenPipeError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.real.flush()
            except BrokenPipeError:
                self.gone = True

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return self.real.encoding

    @property
    def errors(self) -> str | None:
        return self.real.errors

    def isatty(self) -> bool:
        return self.real.isatty()

    def fileno(self) -> int:
        return self.real.fileno()
