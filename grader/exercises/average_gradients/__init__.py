"""The exercise `average_gradients` of distributed.ipynb (average the gradients over the
ranks): its public checks (checks.py), which students get, and in private/ what they never
get. Its modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
