"""The exercise `train_ddp` of distributed.ipynb (training with DistributedDataParallel): its
public checks (checks.py), which students get, and in private/ what they never get. Its
modules import `grader.api`, other exercises' public checks and
`grader.exercises.catalogue`."""
