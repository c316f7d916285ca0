"""The exercise `try_all_gpus` of from_scratch.ipynb (list every GPU, or the CPU): its public checks
(checks.py), which students get, and in private/ what they never get. Its modules import
`grader.api`, other exercises' public checks and `grader.exercises.catalogue`."""
