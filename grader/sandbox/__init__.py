"""Sandbox: the fenced child that runs student code, and how the grader starts and watches it."""
