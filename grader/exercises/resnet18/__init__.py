"""The exercise `resnet18` of concise.ipynb (the modified ResNet-18): its public checks
(checks.py), which students get, and in private/ what they never get. Its modules import
`grader.api`, other exercises' public checks and `grader.exercises.catalogue`."""
