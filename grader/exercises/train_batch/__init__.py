"""The exercise `train_batch` of from_scratch.ipynb (one data-parallel SGD step): its public checks
(checks.py), which students get, and in private/ what they never get. Its modules import
`grader.api`, other exercises' public checks and `grader.exercises.catalogue`."""
