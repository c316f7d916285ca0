"""The exercise `allreduce` of from_scratch.ipynb (sum across devices, in place): its public checks
(checks.py), which students get, and in private/ what they never get. Its modules import
`grader.api`, other exercises' public checks and `grader.exercises.catalogue`."""
