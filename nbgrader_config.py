"""nbgrader settings: the reference notebooks are the source, the student notebooks the release.

    nbgrader generate_assignment multigpu --force

turns solutions/multigpu/*.ipynb into exercises/multigpu/*.ipynb, replacing every solution
with the stub below and removing the hidden checks, and adds the assignment to gradebook.db
(`make exercises` runs it with --no-db, for the release alone). --force because the release
is part of the repository: without it nbgrader skips the assignment and makes no gradebook.
nbgrader reads this file from the folder it runs in: run it from the repository's root
(docs/grading.md walks through the whole round trip).
"""

c = get_config()  # noqa: F821 (nbgrader provides get_config)

c.CourseDirectory.course_id = "multigpu-lab"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"

STUB = "# YOUR CODE HERE\nraise NotImplementedError('write this function, then run its check')"
# Another language's release (`make exercises` sets LAB_RELEASE_LANGUAGE) takes its stub from
# i18n/<language>/release.toml, so that a student meets it in the notebook's language.
_language = __import__("os").environ.get("LAB_RELEASE_LANGUAGE", "")
if _language:
    with open(f"i18n/{_language}/release.toml", "rb") as _f:
        STUB = __import__("tomllib").load(_f)["code_stub"]
c.ClearSolutions.code_stub = {"python": STUB}

# The notebooks train for real when nbgrader runs them (autograde): give cells time.
c.ExecutePreprocessor.timeout = 900

# Under a class's hub, collect takes each submission for the student whose account made it, and
# sets aside, in forged/, one that a student's account handed in under another student's name
# (hub/lab_exchange.py; the accounts' prefix is HUB_USER_PREFIX, as for the hub). release_feedback
# gives each feedback page to its student's account alone (hub/lab_feedback.py).
_hub = __import__("grader.manifest").manifest.REPO / "hub"
if (_hub / "lab_exchange.py").exists():  # (a checkout; the lab's image has no hub/)
    c.ExchangeFactory.release_assignment = "hub.lab_exchange.LabRelease"  # (its inbound: sticky)
    c.ExchangeFactory.collect = "hub.lab_exchange.LabCollect"
    c.ExchangeFactory.release_feedback = "hub.lab_feedback.LabReleaseFeedback"
