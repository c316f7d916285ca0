"""After the course: remove the students' system accounts that the hub made, their homes and
what they left running, and (with --state) the hub's state folder.

    python -m hub.clear [--state DIR] [--prefix lab-] [--yes]

The accounts are `<prefix><name>` for each name in the state folder's passwords.csv (the
names the hub gave a login), and only those that exist. Without --yes it lists what it would
remove and changes nothing. Run it as root, with the hub stopped.
"""

from __future__ import annotations

import argparse
import csv
import os
import pwd
import shutil
import sys
from pathlib import Path

from hub.lab_hub import REPO, remove_account


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
            found.append(pwd.getpwnam(prefix + name))
        except KeyError:
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hub.clear", description=__doc__.split("\n")[0])
    p.add_argument(
        "--state", type=Path, default=Path(os.environ.get("HUB_STATE") or REPO / "hub" / "state")
    )
    p.add_argument("--prefix", default=os.environ.get("HUB_USER_PREFIX", "lab-"))
    p.add_argument("--with-state", action="store_true", help="remove the state folder too")
    p.add_argument("--yes", action="store_true", help="remove them; without it, only list")
    args = p.parse_args(argv)
    if not args.prefix:
        print("hub.clear: an empty --prefix would name the system's own accounts", file=sys.stderr)
        return 2
    if not args.state.is_dir():
        print(f"hub.clear: no state folder at {args.state}; pass --state DIR", file=sys.stderr)
        return 2
    found = accounts(args.state, args.prefix)
    for entry in found:
        print(f"{'removing' if args.yes else 'would remove'} {entry.pw_name} and {entry.pw_dir}")
    if args.with_state:
        print(f"{'removing' if args.yes else 'would remove'} the state folder {args.state}")
    if not args.yes:
        print("hub.clear: nothing changed; run again with --yes")
        return 0
    if found and os.geteuid() != 0:
        print("hub.clear: removing accounts needs root", file=sys.stderr)
        return 2
    for entry in found:
        if not remove_account(entry.pw_name):
            print(f"hub.clear: {entry.pw_name} could not be removed", file=sys.stderr)
            return 1
    if args.with_state:
        shutil.rmtree(args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
