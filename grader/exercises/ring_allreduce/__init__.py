"""The exercise `ring_allreduce` of distributed.ipynb (a ring all-reduce from sends and
receives): its public checks (checks.py), which students get, and in private/ what they
never get. Its modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
