"""Load: find a submission, its notebooks, and the reference solutions."""
