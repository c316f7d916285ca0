"""The exercise `all_gather` of sharded.ipynb (all-gather from sends and receives): its public
checks (checks.py), which students get, and in private/ what they never get. Its modules
import `grader.api`, other exercises' public checks and `grader.exercises.catalogue`."""
