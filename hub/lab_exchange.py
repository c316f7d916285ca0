"""nbgrader's collect for a class's hub: a submission counts for the student whose account made it.

nbgrader's exchange cannot stop a student from handing work in under another student's name:
its inbound folder is open to every student's account, and `nbgrader submit --student=carol`
(or a plain copy into that folder) names the submission `carol+<assignment>+<time>+<random>`
whoever runs it. nbgrader's collect then takes the newest submission by that name, so a
forgery handed in after carol's own replaces it. What the exchange does record is the
submission's owner: under the process spawner run by root, each student's lab runs as an account
of their own, `<prefix><name>` (hub/lab_hub.py, HUB_USER_PREFIX).

`LabCollect` reads that owner back as the student's name on the hub. A submission whose account
is another student's is not collected under the name it claims: it is copied to
`forged/<maker>/<assignment>/` of the course (grader.load.submission.SET_ASIDE) and named in one
line, and the student it named keeps their own newest submission. Honest submissions pass
without a word (nbgrader's own check warns about every one of them, since `lab-carol` is not
`carol`). A submission made by an account that is no student's lab account (the instructor's,
or every lab's single user in containers) cannot be checked: collect says how many, once.

The instructor's nbgrader_config.py names this class (`ExchangeFactory.collect`); the prefix
is HUB_USER_PREFIX, as for the hub, or `LabCollect.account_prefix`.
"""

from __future__ import annotations

import os
import pwd

from nbgrader.exchange.default.collect import ExchangeCollect
from traitlets import Unicode, default

from grader.load.submission import SET_ASIDE, handed_in_as_another, unchecked_owners


def owner_of(path: str) -> str | None:
    """The name of the account that owns `path`, or None for an id with no account."""
    try:
        return pwd.getpwuid(os.stat(path).st_uid).pw_name
    except KeyError:
        return None


class LabCollect(ExchangeCollect):
    """nbgrader's collect, taking each submission for the student whose account made it (see
    the module's docstring); `check_owner` off turns the check off, as it does nbgrader's."""

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

    def _path_to_record(self, path):
        record = super()._path_to_record(path)
        if not self.check_owner:
            return record
        account = owner_of(path)
        maker = self.student_of(account)
        if maker is None:
            record["unchecked"] = account or "?"
        elif maker != record["username"]:
            # a group of its own, so that it is never the newest of the student it names
            record.update(claimed=record["username"], maker=maker, account=account)
            record["username"] = (maker, record["filename"])
        return record

    def copy_files(self):
        forged = [r for r in self.src_records if "maker" in r]
        unchecked = sorted({r["unchecked"] for r in self.src_records if "unchecked" in r})
        self.src_records = [r for r in self.src_records if "maker" not in r]
        checking, self.check_owner = self.check_owner, False  # (ours replaces nbgrader's)
        try:
            super().copy_files()
        finally:
            self.check_owner = checking
        assignment = self.coursedir.assignment_id
        for record in forged:
            aside = os.path.join(
                self.coursedir.format_path(SET_ASIDE, record["maker"], assignment),
                record["filename"],
            )
            if not os.path.isdir(aside):
                self.do_copy(os.path.join(self.inbound_path, record["filename"]), aside)
            self.log.warning(
                handed_in_as_another(record["maker"], record["claimed"], assignment, aside)
            )
        if unchecked:
            count = sum("unchecked" in r for r in self.src_records)
            self.log.warning(unchecked_owners(count, assignment, unchecked))
