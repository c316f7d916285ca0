"""Where a report goes, as a Unix user means it.

- `-` and `/dev/stdout` are standard output (`/dev/stderr` standard error): the report is
  written to the stream the command has, once, and never read back.
- A symlink is written through and kept: the file it leads to is replaced atomically (a
  temporary file beside the target, renamed onto it), keeping its mode.
- A character device, a FIFO or a socket (`/dev/null`, `/dev/tty`, a named pipe) is
  written directly, once, never renamed onto and never read back.
- Anything else is a regular file, replaced atomically, so that a reader sees the old or
  the new content, never half of it; a new one gets the mode `>` would give it.

`validate_report_paths` says, before any grading, what cannot be written and what to do.
"""

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from labtext import _

STDOUT = frozenset({"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})
STDERR = frozenset({"/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"})


class ReportPathError(ValueError):
    """A report's path cannot be written (its folder is missing, it is a folder, no right)."""


def is_stdout(path: Path | str | None) -> bool:
    """Return True where `path` means standard output (`-`, `/dev/stdout`)."""
    return path is not None and os.fspath(path) in STDOUT


def standard_stream(path: Path | str) -> TextIO | None:
    """Return the standard stream that `path` names (`-`, `/dev/stdout`, `/dev/stderr`), or
    None."""
    name = os.fspath(path)
    if name in STDOUT:
        return sys.stdout
    if name in STDERR:
        return sys.stderr
    return None


def is_stream(path: Path | str) -> bool:
    """Return True where `path` is written as a stream (once, directly, never read back): a
    standard stream, or what is neither a regular file nor a folder (a character device,
    a FIFO, a socket), a symlink's target included."""
    if standard_stream(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def readable_report(path: Path | str | None) -> bool:
    """Return True where a previous report may be read back from `path`: a regular file,
    never a stream (reading one's own output pipe would wait forever)."""
    return path is not None and not is_stream(path) and os.path.isfile(path)


def umask() -> int:
    """Return this process's umask without changing it (which would race other threads)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


_kept: list[int] = []  # standard output, kept for a report while the rest goes to stderr


@contextlib.contextmanager
def stdout_kept_for_reports(wanted: bool) -> Iterator[None]:
    """Where `wanted` (a report goes to standard output), keep standard output for the
    reports alone: what anything else prints there (file descriptor 1, in this process and
    what it starts) goes to standard error meanwhile."""
    if not wanted:
        yield
        return
    sys.stdout.flush()
    kept = os.dup(1)
    os.dup2(2, 1)
    _kept.append(kept)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os.dup2(kept, 1)
        _kept.remove(kept)
        os.close(kept)


def write_to_stream(stream: TextIO, text: str) -> None:
    """Write `text` to a standard stream as UTF-8 (what a file would hold); a reader that
    has gone (`| head`) leaves the rest unwritten."""
    try:
        stream.flush()
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # no file behind it (a test's buffer)
        stream.write(text)
        return
    if fd == 1 and _kept:
        fd = _kept[-1]
    data = memoryview(text.encode("utf-8"))
    with contextlib.suppress(BrokenPipeError):
        while data:
            data = data[os.write(fd, data) :]


def write_report(path: Path | str, text: str) -> None:
    """Write `text` to `path` as the module docstring says: a standard stream or a device
    directly, a regular file (a symlink's target) atomically."""
    stream = standard_stream(path)
    if stream is not None:
        write_to_stream(stream, text)
        return
    if is_stream(path):
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return
    target = Path(os.path.realpath(path))  # a symlink stays; the file it leads to is replaced
    target.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(target.parent, os.W_OK | os.X_OK) and os.access(target, os.W_OK):
        with open(target, "w", encoding="utf-8", newline="") as f:  # as `>` would: in place
            f.write(text)
        return
    try:
        before = os.stat(target)
        mode = stat.S_IMODE(before.st_mode)
    except FileNotFoundError:
        before, mode = None, 0o666 & ~umask()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            os.fchmod(f.fileno(), mode)
            if before is not None and (before.st_uid, before.st_gid) != (
                os.geteuid(),
                os.getegid(),
            ):
                with contextlib.suppress(OSError):  # root keeps the file its owner's
                    os.fchown(f.fileno(), before.st_uid, before.st_gid)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _shown(path: Path | str) -> str:
    """Return a path as the user typed it."""
    return os.fspath(path)


def _check_file(option: str, path: Path | str) -> None:
    """Raise ReportPathError unless the report file `path` (a new one, or one to replace)
    can be written."""
    shown = _shown(path)
    if standard_stream(path) is not None:
        return
    if is_stream(path):
        if not os.access(path, os.W_OK):
            raise ReportPathError(
                _("{option} {path}: no permission to write to it; choose a path you can write")
                .format(option=option, path=shown)
            )  # fmt: skip
        return
    if os.path.isdir(path):
        raise ReportPathError(
            _("{option} {path} is a folder; name a file in it, such as {example}").format(
                option=option, path=shown, example=os.path.join(shown, f"report{_suffix(option)}")
            )
        )
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    if not os.path.exists(folder):
        raise ReportPathError(
            _("{option} {path}: the folder {folder} does not exist; make it first "
              "(mkdir -p {folder}) or choose another path").format(
                option=option, path=shown, folder=folder)
        )  # fmt: skip
    if not os.path.isdir(folder):
        raise ReportPathError(
            _("{option} {path}: {folder} is not a folder").format(
                option=option, path=shown, folder=folder
            )
        )
    if os.path.exists(target):
        if not os.access(target, os.W_OK):
            raise ReportPathError(
                _("{option} {path}: no permission to write to it; choose a path you can write")
                .format(option=option, path=shown)
            )  # fmt: skip
        return  # (replaced atomically where its folder allows, else written in place)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ReportPathError(
            _("{option} {path}: no permission to write into the folder {folder}; choose a "
              "folder you can write to").format(option=option, path=shown, folder=folder)
        )  # fmt: skip


def _suffix(option: str) -> str:
    """Return the usual file suffix of a report option's file."""
    return {"--csv": ".csv", "--gradebook": ".db"}.get(option, ".json")


def _check_folder(option: str, folder: Path | str) -> None:
    """Raise ReportPathError unless `folder` is, or can be made, a folder to write into."""
    shown = _shown(folder)
    existing = next(p for p in (Path(folder), *Path(folder).absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ReportPathError(
            _("{option} {path}: {folder} is not a folder").format(
                option=option, path=shown, folder=existing
            )
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ReportPathError(
            _("{option} {path}: no permission to write into the folder {folder}; choose a "
              "folder you can write to").format(option=option, path=shown, folder=existing)
        )  # fmt: skip


def validate_report_paths(
    files: dict[str, Path | None],
    folders: dict[str, Path | None] | None = None,
    streams: dict[str, Path | None] | None = None,
    databases: dict[str, Path | None] | None = None,
) -> None:
    """Raise ReportPathError, saying what is wrong and what to do, unless every report can
    be written: `files` (`--json`, `--csv`: standard output or a file), `folders`
    (`--gradescope`: a folder made if missing), `streams` (`--feedback`: standard output, or
    a folder its own check looks at), `databases` (`--gradebook`: an existing file, written
    in place). Two reports for standard output, or for one file, are refused too."""
    folders, streams, databases = folders or {}, streams or {}, databases or {}
    _check_one_on_stdout({**files, **streams})
    _check_no_streams({**folders, **databases})
    for option, path in files.items():
        if path is not None:
            _check_file(option, path)
    for option, path in folders.items():
        if path is not None:
            _check_folder(option, path)
    for option, path in databases.items():
        if path is not None:
            _check_database(option, path)
    _check_one_each({**files, **databases})


def _check_one_on_stdout(paths: dict[str, Path | None]) -> None:
    """Raise ReportPathError where more than one report of `paths` asks for standard
    output."""
    to_stdout = [
        option
        for option, path in paths.items()
        if path is not None and standard_stream(path) is sys.stdout
    ]
    if len(to_stdout) > 1:
        raise ReportPathError(
            _("{options} each ask for standard output, which can take one report only; "
              "write all but one of them to files").format(options=", ".join(to_stdout))
        )  # fmt: skip


def _check_no_streams(paths: dict[str, Path | None]) -> None:
    """Raise ReportPathError where a report written as files (`paths`) names a standard
    stream."""
    for option, path in paths.items():
        if path is not None and standard_stream(path) is not None:
            raise ReportPathError(
                _(
                    "{option} {path}: this output is written as files, not to a stream; give a path"
                ).format(option=option, path=_shown(path))
            )


def _check_database(option: str, path: Path | str) -> None:
    """Raise ReportPathError unless the database `path`, where it exists, is a file that can
    be written in place, in a folder that can take its journal."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise ReportPathError(
            _("{option} {path} is not a file").format(option=option, path=_shown(path))
        )
    if os.path.exists(path):
        _check_file(option, path)
        folder = os.path.dirname(os.path.realpath(path))
        if not os.access(folder, os.W_OK | os.X_OK):  # (where its journal goes)
            raise ReportPathError(
                _("{option} {path}: no permission to write into the folder {folder}; "
                  "choose a folder you can write to").format(
                    option=option, path=_shown(path), folder=folder)
            )  # fmt: skip


def _check_one_each(paths: dict[str, Path | None]) -> None:
    """Raise ReportPathError where two reports of `paths` would write one file (streams
    aside)."""
    seen: dict[str, str] = {}
    for option, path in paths.items():
        if path is None or is_stream(path):
            continue
        target = os.path.realpath(path)
        if target in seen:
            raise ReportPathError(
                _("{first} and {second} both write {path}; give each its own file").format(
                    first=seen[target], second=option, path=target
                )
            )
        seen[target] = option
