"""The exercise `get_params` of from_scratch.ipynb (copy the parameters to a device): its
public checks (checks.py), which students get, and in private/ what they never get. Its
modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
