"""The catalogue of known wrong implementations, one module per exercise.

Each entry is the source of a wrong function, the check it must fail and words its hint
must contain. `tests/test_mistakes.py` grades every entry and holds the checks to it.
"""
