# A student's lab under a class's hub with nbgrader's exchange (start-lab uses this folder when
# LAB_EXCHANGE is set): the Assignments tab fetches the course's released notebooks from the
# exchange and submits them there.
import os

c = get_config()  # noqa: F821 (nbgrader provides get_config)
c.Exchange.root = os.environ["LAB_EXCHANGE"]
c.CourseDirectory.course_id = os.environ.get("LAB_COURSE") or "multigpu-lab"
# The list's Validate button runs a fetched notebook from top to bottom, its demo training
# included, as autograde will: give cells the course's time (nbgrader's default of 30 s
# interrupts the training, and then reports the notebook as passing all the same).
c.ExecutePreprocessor.timeout = 900
# Submissions carry the hub's name for the student, not the account the lab runs under
# (lab-ann under the process spawner, `student` in every container).
if os.environ.get("JUPYTERHUB_USER"):
    from nbgrader.exchange.default.submit import ExchangeSubmit

    hub_name = os.environ["JUPYTERHUB_USER"]
    c.CourseDirectory.student_id = hub_name

    class HubNameSubmit(ExchangeSubmit):
        """Refuses a submission under any other name than the hub's (`nbgrader submit
        --student=carol` in dan's Terminal). A courtesy, not the guard: a student can get
        around their own lab's settings, so the instructor's collect checks who made each
        submission (hub/lab_exchange.py)."""

        def init_dest(self):
            if self.coursedir.student_id != hub_name:
                from grader.load.submission import not_your_name

                self.fail(not_your_name(hub_name, self.coursedir.student_id))
            super().init_dest()

        def copy_files(self):
            super().copy_files()
            if os.environ.get("HUB_USER_PREFIX"):  # each lab its own account, collect as root
                close_submission(os.path.join(self.inbound_path, self.assignment_filename))

    def close_submission(path: str) -> None:
        """Make a submission this account's alone (nbgrader leaves it open to every account,
        for a name that no one else can list): root's collect reads it all the same."""
        os.chmod(path, 0o700)
        for folder, folders, files in os.walk(path):
            for name in folders:
                os.chmod(os.path.join(folder, name), 0o700)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o600)

    c.ExchangeFactory.submit = HubNameSubmit
