"""The exercise `split_batch` of from_scratch.ipynb (split a minibatch across devices): its
public checks (checks.py), which students get, and in private/ what they never get. Its
modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
