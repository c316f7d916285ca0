"""The exercise `sharded_optimizer` of sharded.ipynb (a sharded optimizer, ZeRO stage 1): its
public checks (checks.py), which students get, and in private/ what they never get. Its
modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
