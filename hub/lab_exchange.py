"""nbgrader's collect for a class's hub: a submission counts for the student whose account made it.

nbgrader's exchange cannot stop a student from handing work in under another student's name:
its inbound folder is open to every student's account, and `nbgrader submit --student=carol`
(or a plain copy into that folder) names the submission `carol+<assignment>+<time>+<random>`
whoever runs it. nbgrader's collect then takes the newest submission by that name, so a
forgery handed in after carol's own replaces it. What the exchange does record is the
submission's owner: under the process spawner run by root, each student's lab runs as an account
of their own, `<prefix><name>` (hub/lab_hub.py, HUB_USER_PREFIX).

`LabCollect` reads that owner back as the student's name on the hub: the owner of what it finds
in the inbound folder, never of what a link there points to. A submission whose account is
another student's is not collected under the name it claims: it is copied to
`forged/<maker>/<assignment>/` of the course (grader.load.submission.SET_ASIDE) and named in one
line, and the student it named keeps their own newest submission. Honest submissions pass
without a word (nbgrader's own check warns about every one of them, since `lab-carol` is not
`carol`). A submission made by an account that is no student's lab account (the instructor's,
or every lab's single user in containers) cannot be checked: collect says how many, once.

nbgrader copies a submission with `shutil.copytree`, which copies what a link points to, reads
a device or a named pipe as if it were a file, and keeps the exchange's modes (a submission's
folder there is open to every account). So collect refuses, whoever made it, a submission that
is a symbolic link or holds one, holds a device file, a named pipe or a socket, or holds a file
or folder of another account (a hard link to another's file among them): it is set aside as a
forgery is, with the one line saying why, and what it holds is never copied through a link.
Collect copies the rest itself, without following a link, into files and folders of the
collecting account that no other account may open (group ones too where the course is
`CourseDirectory.groupshared`).

The instructor's nbgrader_config.py names this class (`ExchangeFactory.collect`); the prefix
is HUB_USER_PREFIX, as for the hub, or `LabCollect.account_prefix`.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import pwd
import shutil
import stat
from collections.abc import Callable
from functools import partial

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.release_assignment import ExchangeReleaseAssignment
from traitlets import Unicode, default

from grader.load.submission import (
    DEVICE,
    FIFO,
    HARD_LINK,
    LINK,
    NOT_A_FOLDER,
    OTHERS,
    SET_ASIDE,
    SOCKET,
    handed_in_as_another,
    refused_submission,
    unchecked_owners,
    unsafe_entry,
)

# Opening what a student made: never through a link, never waiting on a named pipe.
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SPECIAL = {
    stat.S_IFCHR: DEVICE,
    stat.S_IFBLK: DEVICE,
    stat.S_IFIFO: FIFO,
    stat.S_IFSOCK: SOCKET,
}


def account_of(uid: int) -> str | None:
    """The name of the account with id `uid`, or None for an id with no account."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def owner_of(path: str) -> str | None:
    """The name of the account that owns `path` itself (a link, not what it points to), or
    None for an id with no account."""
    return account_of(os.lstat(path).st_uid)


class Unsafe(Exception):
    """What a submission holds that collect never copies; the message says what and where."""


def unsafe(found: os.stat_result, where: str, maker: int, link: Callable[[], str]) -> str | None:
    """Why `found` (lstat's or fstat's, at `where` in a submission that account `maker` made)
    is not to be copied; None when it is a folder or plain file of `maker`'s. `link` reads a
    link's target."""
    kind = stat.S_IFMT(found.st_mode)
    if kind == stat.S_IFLNK:
        try:
            target = link()
        except OSError:
            target = "?"
        return unsafe_entry(LINK, where, target=target)
    if kind not in (stat.S_IFDIR, stat.S_IFREG):
        return unsafe_entry(_SPECIAL.get(kind, DEVICE), where)
    if found.st_uid != maker:
        account = account_of(found.st_uid) or str(found.st_uid)
        hard = kind == stat.S_IFREG and found.st_nlink > 1
        return unsafe_entry(HARD_LINK if hard else OTHERS, where, account=account)
    return None


def _unknown() -> str:
    return "?"


class SubmissionCopy:
    """Reads a submission in the exchange without following a link, checking everything in it
    (see `unsafe`), and copies it, if asked, into files and folders of the collecting account
    with `modes` (for folders, for files) that close them to other accounts."""

    def __init__(
        self,
        modes: tuple[int, int] = (0o700, 0o600),
        skip: Callable[[str, os.stat_result], bool] = lambda name, found: False,
    ) -> None:
        self.folder_mode, self.file_mode = modes
        self.skip = skip  # what nbgrader's CourseDirectory.ignore, include, max_file_size leave out

    def check(self, path: str, label: str) -> str | None:
        """Why the submission at `path` (called `label` in what is said) is refused; None when
        it holds nothing but its maker's own folders and plain files."""
        try:
            self.copy(path, None, label)
        except Unsafe as why:
            return str(why)
        return None

    def copy(self, path: str, dest: str | None, label: str, lenient: bool = False) -> list[str]:
        """Copy the submission at `path` to `dest` (None: only read it). The first thing it
        must not copy raises Unsafe; `lenient` leaves each out instead and returns why."""
        refused: list[str] = []

        def refuse(why: str) -> None:
            if not lenient:
                raise Unsafe(why)
            refused.append(why)

        found = os.lstat(path)
        maker = found.st_uid
        why = unsafe(found, label, maker, partial(os.readlink, path))
        if why is None and not stat.S_ISDIR(found.st_mode):
            why = unsafe_entry(NOT_A_FOLDER, label)
        if why is None:
            self._copy(None, path, label, maker, dest, refuse)
        else:
            refuse(why)
            if dest is not None:
                self._folder(dest)
        return refused

    def _folder(self, dest: str) -> None:
        os.mkdir(dest, 0o700)
        os.chmod(dest, self.folder_mode)

    def _copy(
        self, folder: int | None, name: str, where: str, maker: int, dest: str | None, refuse
    ) -> None:
        """Copy `name` in the open `folder` (None: `name` is the submission's path), a folder
        or plain file that lstat found fit, to `dest`, checking again what it opened (a student
        may change their own submission while collect reads it)."""
        try:
            opened = os.open(name, _OPEN, dir_fd=folder)
        except OSError as error:  # (changed since lstat read it)
            if error.errno == errno.ELOOP:
                refuse(unsafe_entry(LINK, where, target="?"))
            else:
                refuse(f"{where}: {error.strerror}")
            return
        try:
            found = os.fstat(opened)
            why = unsafe(found, where, maker, _unknown)
            if why is None and folder is None and not stat.S_ISDIR(found.st_mode):
                why = unsafe_entry(NOT_A_FOLDER, where)
            if why is not None:
                refuse(why)
            elif stat.S_ISDIR(found.st_mode):
                if dest is not None:
                    self._folder(dest)
                for entry in sorted(os.listdir(opened)):
                    inside = f"{where}/{entry}"
                    seen = os.stat(entry, dir_fd=opened, follow_symlinks=False)
                    why = unsafe(seen, inside, maker, partial(os.readlink, entry, dir_fd=opened))
                    if why is not None:
                        refuse(why)
                        continue
                    skipped = dest is None or self.skip(entry, seen)
                    into = None if skipped else os.path.join(dest, entry)
                    self._copy(opened, entry, inside, maker, into, refuse)
            elif dest is not None:
                self._copy_file(opened, dest, found)
        finally:
            os.close(opened)

    def _copy_file(self, source: int, dest: str, found: os.stat_result) -> None:
        made = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(made, "wb") as write, open(os.dup(source), "rb") as read:
            shutil.copyfileobj(read, write)
            write.flush()
            os.fchmod(made, self.file_mode | (found.st_mode & 0o100))
            os.utime(made, ns=(found.st_atime_ns, found.st_mtime_ns))


def close_up(path: str, modes: tuple[int, int]) -> None:
    """Close the folder or file at `path`, and all in it, to other accounts (to all but the
    group, for `modes` that say so): what an older collect left open. Links are left alone."""
    folder_mode, file_mode = modes
    found = os.lstat(path)
    if stat.S_ISDIR(found.st_mode):
        os.chmod(path, folder_mode)
        for name in os.listdir(path):
            close_up(os.path.join(path, name), modes)
    elif stat.S_ISREG(found.st_mode):
        os.chmod(path, file_mode | (found.st_mode & 0o100))


class LabCollect(ExchangeCollect):
    """nbgrader's collect, taking each submission for the student whose account made it and
    refusing any that holds a link, a device, a named pipe or another's file (see the module's
    docstring); `check_owner` off turns the name check off, as it does nbgrader's."""

    account_prefix = Unicode(
        config=True, help="Put before a student's name for their account (HUB_USER_PREFIX)."
    )

    @default("account_prefix")
    def _hub_prefix(self) -> str:
        return os.environ.get("HUB_USER_PREFIX", "lab-")

    def student_of(self, account: str | None) -> str | None:
        """The hub's name of the student whose lab runs as `account`; None for any other."""
        prefix = self.account_prefix
        if account and prefix and account.startswith(prefix) and len(account) > len(prefix):
            return account[len(prefix) :]
        return None

    @property
    def modes(self) -> tuple[int, int]:
        """The modes of what collect writes: its account's alone, or its group's too where the
        course is group-shared."""
        return (0o2770, 0o660) if self.coursedir.groupshared else (0o700, 0o600)

    def copier(self) -> SubmissionCopy:
        """What copies a submission, leaving out what the course directory's settings do."""
        course = self.coursedir

        def skip(name: str, found: os.stat_result) -> bool:
            if any(fnmatch.fnmatch(name, glob) for glob in course.ignore):
                return True
            if not stat.S_ISREG(found.st_mode):
                return False
            if course.include and not any(fnmatch.fnmatch(name, g) for g in course.include):
                return True
            if course.max_file_size and found.st_size > 1000 * course.max_file_size:
                self.log.warning("Ignoring file too large '%s' (%d bytes)", name, found.st_size)
                return True
            return False

        return SubmissionCopy(self.modes, skip)

    def _path_to_record(self, path):
        record = super()._path_to_record(path)
        account = owner_of(path)
        maker = self.student_of(account)
        why = self.copier().check(path, record["filename"])
        if why is not None:
            # set aside as a forgery is, in a group of its own (never anyone's newest)
            made_by = maker or account or str(os.lstat(path).st_uid)
            record.update(claimed=record["username"], maker=made_by, refused=why)
            record["username"] = (made_by, record["filename"])
            return record
        if not self.check_owner:
            return record
        if maker is None:
            record["unchecked"] = account or "?"
        elif maker != record["username"]:
            # a group of its own, so that it is never the newest of the student it names
            record.update(claimed=record["username"], maker=maker, account=account)
            record["username"] = (maker, record["filename"])
        return record

    def do_copy(self, src, dest, log=None):
        """Copy a submission as nbgrader does, but never through a link, and closed (see
        `SubmissionCopy`); one found unfit only now (changed since it was checked) is set aside
        instead, with its line."""
        size = self.get_size(src)
        if size > 1000 * self.coursedir.max_dir_size:
            self.log.error("Directory size is too big")
            raise RuntimeError(f"Directory size is too big: {size} bytes, {src}")
        filename = os.path.basename(src)
        try:
            self.copier().copy(src, dest, filename)
        except Unsafe as why:
            shutil.rmtree(dest, ignore_errors=True)
            account = owner_of(src) or "?"
            maker = self.student_of(account) or account
            claimed = super()._path_to_record(src)["username"]
            kept = self.set_aside(maker, filename)
            assignment = self.coursedir.assignment_id
            self.log.warning(refused_submission(maker, claimed, assignment, str(why), kept))

    def set_aside(self, maker: str, filename: str) -> str:
        """Copy the exchange's submission `filename` aside, under `maker` (SET_ASIDE), leaving
        out all that collect refuses; return where it is."""
        folder = self.coursedir.format_path(SET_ASIDE, maker, self.coursedir.assignment_id)
        kept = os.path.join(folder, filename)
        if not os.path.lexists(kept):
            os.makedirs(folder, exist_ok=True)
            src = os.path.join(self.inbound_path, filename)
            self.copier().copy(src, kept, filename, lenient=True)
        self.close(kept, parents=3)
        return kept

    def copy_files(self):
        aside = [r for r in self.src_records if "maker" in r]
        unchecked = sorted({r["unchecked"] for r in self.src_records if "unchecked" in r})
        self.src_records = [r for r in self.src_records if "maker" not in r]
        checking, self.check_owner = self.check_owner, False  # (ours replaces nbgrader's)
        try:
            super().copy_files()
        finally:
            self.check_owner = checking
        assignment = self.coursedir.assignment_id
        for record in self.src_records:  # (and what an earlier collect left)
            collected = self.coursedir.format_path(
                self.coursedir.submitted_directory, record["username"], assignment
            )
            self.close(collected, parents=1)
        for record in aside:
            maker, claimed = record["maker"], record["claimed"]
            kept = self.set_aside(maker, record["filename"])
            if "refused" in record:
                said = refused_submission(maker, claimed, assignment, record["refused"], kept)
            else:
                said = handed_in_as_another(maker, claimed, assignment, kept)
            self.log.warning(said)
        if unchecked:
            count = sum("unchecked" in r for r in self.src_records)
            self.log.warning(unchecked_owners(count, assignment, unchecked))

    def close(self, path: str, parents: int) -> None:
        """Close what collect put at `path` to other accounts, and the `parents` folders above
        it (the student's, in submitted/), where they are the collecting account's."""
        if os.path.lexists(path) and os.lstat(path).st_uid == os.geteuid():
            close_up(path, self.modes)
        for _ in range(parents):
            path = os.path.dirname(path)
            found = os.lstat(path)
            if stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid():
                os.chmod(path, self.modes[0])


class LabRelease(ExchangeReleaseAssignment):
    """nbgrader's release, with the sticky bit on the course's inbound folder, as on /tmp: a
    student's account may hand work in there, but never rename or remove what another
    account handed in, even knowing its name."""

    def init_dest(self):
        super().init_dest()
        os.chmod(self.inbound_path, stat.S_IMODE(os.stat(self.inbound_path).st_mode) | stat.S_ISVTX)
