"""Judge: the checks of each exercise, and their verdicts on the outcomes the pipeline hands
it. Imports the exercises' checks, load and the vocabulary; nothing of the sandbox, and
never student code."""
