"""Judge: the checks of each exercise, and their verdicts on what the child reported. Imports
the exercises' checks, the vocabulary and what the sandbox collected, never student code."""
