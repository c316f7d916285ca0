"""The Python a class's labs run: whether a student's account, with no rights of its own, can
start a lab with it, checked before the hub takes a login and before each lab starts."""

from __future__ import annotations

import pwd
import subprocess

FIX_PYTHON = (
    "As root with the process spawner, leave HUB_PYTHON unset: the hub then makes the lab's "
    "Python in HUB_PYTHON_FOLDER, a folder every account may read, from a system Python "
    "of the same version. Or name with HUB_PYTHON a Python, with the lab and the hub's "
    "packages installed, that lies where every user may enter and read (not under /root)."
)

# What a student's account must be able to do with the lab's Python: import the lab and the
# hub's single-user server, and reach the lab's start script and notebooks; it prints the lab.
LAB_PROBE = """
import importlib.util, os, sys
import grader.manifest as m
if importlib.util.find_spec("jupyterhub.singleuser") is None:
    sys.exit("this Python lacks the hub's packages (jupyterhub)")
lab = str(m.REPO)
for path, mode in ((os.path.join(lab, "docker", "start-lab"), os.X_OK),
                   (os.path.join(lab, "exercises"), os.R_OK | os.X_OK)):
    if not os.access(path, mode):
        sys.exit(f"{path} is closed to this account")
print(lab)
"""


def probe_lab_python(python: str, account: str) -> tuple[str, str]:
    """Run `python` as `account`, with that account's own group alone, as its labs will run:
    (the lab's folder, '') where it can start a lab, else ('', what went wrong)."""
    entry = pwd.getpwnam(account)
    try:
        probe = subprocess.run(
            [python, "-c", LAB_PROBE], user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
            cwd="/", capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    except PermissionError:
        return "", "a folder on the way to it is closed to that account"
    except (OSError, subprocess.TimeoutExpired) as error:
        return "", str(error)
    if probe.returncode:
        lines = probe.stderr.strip().splitlines() or [f"it exited with {probe.returncode}"]
        return "", lines[-1][-300:]
    return probe.stdout.strip(), ""


def check_python_for_students(python: str, account: str = "nobody") -> None:
    """Stop the hub, before it takes a login, where an account with no rights of its own
    (`nobody`) cannot start a lab with the lab's Python."""
    try:
        pwd.getpwnam(account)
    except KeyError:
        return  # no such account to try it with; each student's start still checks
    _, said = probe_lab_python(python, account)
    if said:
        raise SystemExit(
            f"hub: the students' accounts cannot start a lab with {python}: run as "
            f"{account}, {said}. {FIX_PYTHON}"
        )
