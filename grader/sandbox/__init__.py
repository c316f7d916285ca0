"""Sandbox: the fenced child that runs student code, and how the grader starts and watches
it. Imports load and the vocabulary, and nothing of its fast path (`fast/`), which lends it
a fork server and more children through `speedups.py` where the pipeline passes them in."""
