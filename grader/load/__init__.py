"""Load: find a submission, its notebooks, and the reference solutions, and run a notebook's
definitions without its training. Imports the vocabulary below it (manifest, base), dplab and
labtext."""
