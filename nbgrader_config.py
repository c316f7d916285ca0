"""nbgrader settings: the reference notebooks are the source, the student notebooks the release.

    nbgrader generate_assignment multigpu --force   (what `make exercises` runs)

turns solutions/multigpu/*.ipynb into exercises/multigpu/*.ipynb, replacing every solution
with the stub below and removing the hidden checks.
"""

c = get_config()  # noqa: F821 (nbgrader provides get_config)

c.CourseDirectory.course_id = "multigpu-lab"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"

STUB = "# YOUR CODE HERE\nraise NotImplementedError('write this function, then run its check')"
c.ClearSolutions.code_stub = {"python": STUB}

# The notebooks train for real when nbgrader runs them (autograde): give cells time.
c.ExecutePreprocessor.timeout = 900
