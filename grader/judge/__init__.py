"""Judge: the checks of each exercise, and their verdicts on what the child reported."""
