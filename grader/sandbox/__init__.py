"""Sandbox: the fenced child that runs student code, and how the grader starts and watches
it, one loop of children per notebook. Imports load and the vocabulary, and nothing of its
fast path (`fast/`), which lends it a fork server, helper loops and room for more through
`speedups.py` where the pipeline passes them in."""
