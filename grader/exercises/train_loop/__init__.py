"""The exercise `train_loop` of from_scratch.ipynb (the epoch loop): its public checks
(checks.py), which students get, and in private/ what they never get. Its modules import
`grader.api`, other exercises' public checks and `grader.exercises.catalogue`."""
