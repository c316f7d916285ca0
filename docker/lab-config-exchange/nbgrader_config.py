# A student's lab under a class's hub with nbgrader's exchange (start-lab uses this folder when
# LAB_EXCHANGE is set): the Assignments tab fetches the course's released notebooks from the
# exchange and submits them there.
import os

c = get_config()  # noqa: F821 (nbgrader provides get_config)
c.Exchange.root = os.environ["LAB_EXCHANGE"]
c.CourseDirectory.course_id = os.environ.get("LAB_COURSE") or "multigpu-lab"
# Submissions carry the hub's name for the student, not the account the lab runs under
# (lab-ann under the process spawner, `student` in every container).
if os.environ.get("JUPYTERHUB_USER"):
    c.CourseDirectory.student_id = os.environ["JUPYTERHUB_USER"]
