"""nbgrader's release_feedback for a class's hub: each page readable by its student alone.

`python -m grader grade submitted --nbgrader-feedback feedback` writes a page per notebook of
each submission, `feedback/<student>/<assignment>/<notebook>.html`, with the submission's secret
beside them (grader/report/nbgrader_feedback.py). nbgrader's release_feedback copies each page
into the exchange's `<course>/feedback/` folder, a folder no student may list, under a name made
from that secret, which only the student's own lab holds; but it keeps the page's mode, so any
account that learns the name may read the page.

`LabReleaseFeedback` does the same, and gives each page to the account of the student whose
submission it is, `<prefix><name>` (hub/lab_hub.py, HUB_USER_PREFIX), readable by that account
alone: another student cannot read it even by its name. Where it cannot (no such account, as
in containers where every lab runs as one user, or not run by root), it leaves the page as
nbgrader does, readable by every account that knows its name, and says so once.

The instructor's nbgrader_config.py names this class (`ExchangeFactory.release_feedback`).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil

from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback
from nbgrader.utils import notebook_hash
from traitlets import Unicode, default

PAGE_MODE, OWN_MODE = 0o644, 0o600


def account_uid(name: str) -> int | None:
    """The user id of the account `name`, or None where there is none."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


class LabReleaseFeedback(ExchangeReleaseFeedback):
    """nbgrader's release_feedback, each page its student's account's alone where it can be
    (see the module's docstring)."""

    account_prefix = Unicode(
        config=True, help="Put before a student's name for their account (HUB_USER_PREFIX)."
    )

    @default("account_prefix")
    def _hub_prefix(self) -> str:
        return os.environ.get("HUB_USER_PREFIX", "lab-")

    def copy_files(self):
        excluded = set(filter(None, self.coursedir.student_id_exclude.split(",")))
        readable_by_all = []
        for page in sorted(glob.glob(os.path.join(self.src_path, "*.html"))):
            folder, name = os.path.split(page)
            student = os.path.basename(os.path.dirname(folder))
            if student in excluded:
                continue
            with open(os.path.join(folder, "submission_secret.txt")) as f:
                secret = f.read()
            notebook = os.path.splitext(name)[0]
            released = os.path.join(
                self.dest_path, notebook_hash(secret=secret, notebook_id=notebook) + ".html"
            )
            self.log.info(
                "Releasing feedback for student '%s' on assignment '%s/%s/%s'",
                student,
                self.coursedir.course_id,
                self.coursedir.assignment_id,
                notebook,
            )
            copy = released + ".tmp"
            shutil.copyfile(page, copy)
            if not self.give(copy, student):
                readable_by_all.append(student)
            os.replace(copy, released)  # (a student fetching meanwhile reads a whole page)
        if readable_by_all:
            self.log.info(
                "Feedback of %s is readable by every account that knows its name, as "
                "nbgrader leaves it: no account %s<name> to give it to%s",
                ", ".join(sorted(set(readable_by_all))),
                self.account_prefix,
                "" if os.geteuid() == 0 else ", or not run as root",
            )

    def give(self, path: str, student: str) -> bool:
        """Make the page at `path` the student's account's alone; where that cannot be, make it
        readable by all, as nbgrader does. Return whether it is the student's alone."""
        uid = account_uid(self.account_prefix + student) if self.account_prefix else None
        if uid is not None and os.geteuid() == 0:
            os.chown(path, uid, -1)
            os.chmod(path, OWN_MODE)
            return True
        os.chmod(path, PAGE_MODE)
        return False
