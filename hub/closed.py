"""What is the instructor's stays closed to the students' accounts.

Under the process spawner run by root, every student's lab runs as a system account of their
own, with a Terminal. The lab's checkout holds the solutions and every exercise's hidden checks,
and the course folder holds the students' submissions, the grades and nbgrader's gradebook, so
neither may be open to those accounts. The labs do not need either: they run the Python the hub
lends them (hub/running.py), which holds the lab image's files alone.

A folder is closed when some folder on its way from `/` (itself included) gives other accounts
no right at all: neither its "other" bits, nor its group bits where its group has members
besides its owner. The hub refuses to start while one of the instructor's folders is open.
"""

from __future__ import annotations

import grp
import pwd
import stat
from pathlib import Path


def _group_shared(gid: int, owner: int) -> bool:
    """Whether an account other than `owner` is in the group `gid`, by its list or as its
    own group."""
    try:
        if grp.getgrgid(gid).gr_mem:
            return True
    except KeyError:
        return False
    return any(p.pw_gid == gid and p.pw_uid != owner for p in pwd.getpwall())


def rights_of_others(path: Path) -> int:
    """The rights `path`'s own mode gives accounts other than its owner (rwx, as 0 to 7)."""
    info = path.stat()
    rights = info.st_mode & 0o007
    if _group_shared(info.st_gid, info.st_uid):
        rights |= (info.st_mode & 0o070) >> 3
    return rights


def opening(path: Path) -> str:
    """How other accounts may reach into `path`, or '' where they may not: the first folder
    on its way that closes it ends the walk."""
    path = Path(path).resolve()
    for folder in [*reversed(path.parents), path]:
        rights = rights_of_others(folder)
        if folder == path:
            if not rights:
                return ""
            what = "read" if rights & 0o4 else "write" if rights & 0o2 else "enter"
            mode = stat.S_IMODE(folder.stat().st_mode)
            return f"other accounts may {what} it (mode {mode:04o})"
        if not rights & 0o1:
            return ""
    return ""


def closed_on_the_way(path: Path) -> Path | None:
    """The first folder on `path`'s way from `/` that other accounts cannot enter, or None."""
    path = Path(path).resolve()
    for folder in [*reversed(path.parents), path]:
        if folder.exists() and not rights_of_others(folder) & 0o1:
            return folder
    return None


def check_closed(folders: dict[str, Path], exchange: str = "") -> None:
    """Stop the hub, saying what to do, where one of the instructor's `folders` (what it is:
    its path) is open to other accounts, or where the exchange they share is closed to them."""
    said = []
    for what, folder in folders.items():
        if folder.exists() and (how := opening(folder)):
            said.append(
                f"{what} {folder} is open to the students' accounts: {how}. Close it with "
                f"`chmod 700 {folder}`; the labs do not need it"
            )
    if exchange and (closed := closed_on_the_way(Path(exchange).parent)):
        said.append(
            f"nbgrader's exchange {exchange} lies in {closed}, which the students' accounts "
            "cannot enter: put the exchange outside the lab's and the course's folders, "
            "as /srv/nbgrader/exchange"
        )
    if said:
        raise SystemExit("hub: " + ".\nhub: ".join(said) + ".")


def instructors_folders(checkout: Path, course: Path, state: Path) -> dict[str, Path]:
    """The folders that must stay closed, named as the hub's refusal names them."""
    if course.resolve() == checkout.resolve():
        folders = {"the lab's checkout and course folder": checkout}
    else:
        folders = {"the lab's checkout": checkout, "the course folder": course}
    return folders | {"the hub's state folder": state}
