"""The exercise `memory_per_rank` of sharded.ipynb (bytes per rank for DDP and each ZeRO
stage): its public checks (checks.py), which students get, and in private/ what they never
get. Its modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
