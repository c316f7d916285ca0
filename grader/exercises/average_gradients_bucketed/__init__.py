"""The exercise `average_gradients_bucketed` of distributed.ipynb (average the gradients in
buckets): its public checks (checks.py), which students get, and in private/ what they never
get. Its modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
