"""Load: find a submission, its notebooks, and the reference solutions; run a notebook's
definitions without its training, and a case on the student's functions (runner.py). Imports
the vocabulary below it (api, manifest, base), dplab and labtext."""
