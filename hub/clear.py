"""After the course: remove the students' system accounts that the hub made, their homes, what
they left running and every file of theirs elsewhere on the machine, and (with --with-state)
the hub's state folder.

    python -m hub.clear [--state DIR] [--prefix lab-] [--with-state] [--yes]

The accounts are `<prefix><name>` for each name in the state folder's passwords.csv (the
names the hub gave a login), and only those that exist. Their files outside their homes (in
/tmp, /dev/shm, ...: every local file system is searched) are removed, except in nbgrader's
exchange, whose submissions are the course's record: those become the exchange owner's. The
exchange and the students' Python (HUB_PYTHON_FOLDER) stay; it says how to remove them. The
hub writes down its prefix and these folders in the state folder (made.json). Without --yes
it lists what it would do and changes nothing. Run it as root, with the hub stopped.
"""

from __future__ import annotations

import argparse
import csv
import errno
import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

from hub.lab_hub import MADE, REPO, remove_account

# Searched for the accounts' files, each once: the root, each local disk's file system, and
# the temporary folders (tmpfs, often).
DISKS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "overlay"}
TEMPORARY = ("/tmp", "/var/tmp", "/dev/shm", "/run")
PYTHON_FOLDER = "/var/lib/multigpu-lab/python"  # the hub's default HUB_PYTHON_FOLDER


def accounts(state: Path, prefix: str) -> list[pwd.struct_passwd]:
    """The system accounts the hub made for the names in `state`/passwords.csv."""
    passwords = state / "passwords.csv"
    if not passwords.exists():
        return []
    with open(passwords, newline="") as f:
        names = [row["name"] for row in csv.DictReader(f)]
    found = []
    for name in names:
        try:
            entry = pwd.getpwnam(prefix + name)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            found.append(entry)
    return found


def own_group(entry: pwd.struct_passwd) -> bool:
    """Whether the account's group is its own (useradd --user-group), not one it shares."""
    try:
        return entry.pw_gid != 0 and grp.getgrgid(entry.pw_gid).gr_name == entry.pw_name
    except KeyError:
        return False


def made(state: Path) -> dict[str, str]:
    """What the hub wrote down in `state` (hub.lab_hub.record_made), or nothing."""
    try:
        return json.loads((state / MADE).read_text())
    except (OSError, ValueError):
        return {}


def places() -> list[str]:
    """Where the accounts' files may be: / and the other local file systems, each once."""
    candidates = ["/"]
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[2] in DISKS:
                candidates.append(fields[1].replace("\\040", " "))
    candidates += [t for t in TEMPORARY if os.path.isdir(t)]
    seen, chosen = set(), []
    for path in sorted(candidates, key=lambda p: (p.count("/"), p)):
        try:
            device = os.stat(path).st_dev
        except OSError:
            continue
        if device not in seen:
            seen.add(device)
            chosen.append(path)
    return chosen


def owned(uids: list[int], gids: list[int], skip: list[str]) -> list[Path]:
    """Every file whose owner is one of `uids` or whose group is one of `gids`, outside the
    folders `skip` (`find -xdev` on each of `places()`)."""
    if not uids and not gids:
        return []
    pruned: list[str] = []
    for folder in skip:
        pruned += ["-o", "-path", re.sub(r"([*?\[\\])", r"\\\1", folder)]
    owners: list[str] = []
    for uid in uids:
        owners += ["-o", "-uid", str(uid)]
    for gid in gids:
        owners += ["-o", "-gid", str(gid)]
    command = ["find", *places(), "-xdev"]
    if pruned:
        command += ["(", *pruned[1:], ")", "-prune", "-o"]
    command += ["(", *owners[1:], ")", "-print0"]
    found = subprocess.run(command, capture_output=True)  # (it complains of vanished files)
    return [Path(os.fsdecode(p)) for p in found.stdout.split(b"\0") if p]


def inside(path: Path, folder: str) -> bool:
    return bool(folder) and (str(path) == folder or str(path).startswith(folder.rstrip("/") + "/"))


def clear_files(found: list[Path], uids: set[int], exchanges: list[str]) -> list[str]:
    """Remove the files in `found` of the accounts `uids` (deepest first), and give those in
    the `exchanges` to the exchange's owner; a folder that still holds others' files, and a
    file that is only in one of the accounts' groups, become root's. What went wrong."""
    failed = []
    for path in sorted(found, key=lambda p: len(p.parts), reverse=True):
        try:
            info = os.lstat(path)
            exchange = next((e for e in exchanges if inside(path, e)), "")
            if exchange:
                keeper = os.stat(exchange)
                os.lchown(path, keeper.st_uid, keeper.st_gid)
            elif info.st_uid not in uids:
                os.lchown(path, -1, 0)
            elif os.path.isdir(path) and not os.path.islink(path):
                try:
                    os.rmdir(path)
                except OSError as error:
                    if error.errno != errno.ENOTEMPTY:
                        raise
                    os.lchown(path, 0, 0)
                    print(f"hub.clear: kept {path}, which holds others' files; it is root's now")
            else:
                os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as error:
            failed.append(f"{path}: {error.strerror}")
    return failed


def folders(*paths: str) -> list[str]:
    """The folders among `paths` that exist, each once, as their real paths."""
    return sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})


def say_kept(exchanges: list[str], pythons: list[str]) -> None:
    """Say which folders stay, and how to remove them."""
    for exchange in exchanges:
        print(f"hub.clear: keeps nbgrader's exchange {exchange}: the students' submissions are "
              f"the course's record (theirs become the exchange owner's). Remove it with "
              f"`rm -r {exchange}` once the grades are final.")  # fmt: skip
    for folder in pythons:
        print(f"hub.clear: keeps the students' Python in {folder} (HUB_PYTHON_FOLDER), which "
              f"the next class's hub reuses. Remove it with `rm -r {folder}` when no hub "
              "runs.")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hub.clear", description=__doc__.split("\n")[0])
    p.add_argument(
        "--state", type=Path, default=Path(os.environ.get("HUB_STATE") or REPO / "hub" / "state")
    )
    p.add_argument("--prefix", help="the accounts' prefix (default: the hub's, else lab-)")
    p.add_argument("--with-state", action="store_true", help="remove the state folder too")
    p.add_argument("--yes", action="store_true", help="remove them; without it, only list")
    p.add_argument("--yes-is", default="--yes", help=argparse.SUPPRESS)  # make: YES=1
    args = p.parse_args(argv)
    if not args.state.is_dir():
        print(f"hub.clear: no state folder at {args.state}; pass --state DIR", file=sys.stderr)
        return 2
    hub = made(args.state)
    if args.prefix is None:
        args.prefix = hub.get("prefix") or os.environ.get("HUB_USER_PREFIX", "lab-")
    if not args.prefix:
        print("hub.clear: an empty --prefix would name the system's own accounts", file=sys.stderr)
        return 2
    exchanges = folders(hub.get("exchange", ""), os.environ.get("HUB_EXCHANGE", ""))
    pythons = folders(
        hub.get("python_folder", ""), os.environ.get("HUB_PYTHON_FOLDER", ""), PYTHON_FOLDER
    )
    found = accounts(args.state, args.prefix)
    doing = "removing" if args.yes else "would remove"
    for entry in found:
        print(f"{doing} {entry.pw_name} and {entry.pw_dir}")
    if args.with_state:
        print(f"{doing} the state folder {args.state}")
    if found and os.geteuid() != 0:
        print("hub.clear: removing accounts needs root", file=sys.stderr)
        return 2
    uids = [e.pw_uid for e in found]
    gids = [e.pw_gid for e in found if own_group(e)]
    homes = [os.path.realpath(e.pw_dir) for e in found]
    for entry in found if args.yes else []:  # nothing of theirs runs on to make files
        subprocess.run(["pkill", "-KILL", "-u", entry.pw_name], capture_output=True)
    files = owned(uids, gids, homes + pythons)
    outside = sorted(str(f) for f in files if not any(inside(f, e) for e in exchanges))
    if outside:
        shown = ", ".join(outside[:3]) + (", ..." if len(outside) > 3 else "")
        print(f"{doing} their {len(outside)} files outside their homes: {shown}")
    if len(files) > len(outside):
        given = "giving" if args.yes else "would give"
        print(f"{given} their {len(files) - len(outside)} files in the exchange to its owner")
    say_kept(exchanges, pythons)
    if not args.yes:
        print(f"hub.clear: nothing changed; run it again with {args.yes_is} to do it")
        return 0
    failed = clear_files(files, set(uids), exchanges)
    for entry in found:
        if not remove_account(entry.pw_name):
            failed.append(f"{entry.pw_name} could not be removed")
    for what in failed:
        print(f"hub.clear: {what}", file=sys.stderr)
    if failed:
        return 1
    if args.with_state:
        shutil.rmtree(args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
