"""The exercise `train_dataparallel` of concise.ipynb (training with nn.DataParallel): its
public checks (checks.py), which students get, and in private/ what they never get. Its
modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
