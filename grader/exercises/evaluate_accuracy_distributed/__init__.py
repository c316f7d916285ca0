"""The exercise `evaluate_accuracy_distributed` of distributed.ipynb (accuracy over every
rank's shard): its public checks (checks.py), which students get, and in private/ what they
never get. Its modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
