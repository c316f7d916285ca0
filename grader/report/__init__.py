"""Report: the verdicts (grader.base.results) made text once, in the reader's language, and
the files they are written to (JSON, CSV, Gradescope, the gradebook, feedback). Imports the
base, the manifest and labtext; nothing of the judge."""
