"""The exercise `try_gpu` of from_scratch.ipynb (pick GPU i, or the CPU): its public checks
(checks.py), which students get, and in private/ what they never get. Its modules import
`grader.api`, other exercises' public checks and `grader.exercises.catalogue`."""
