"""The grader's base types: cases and checks, what a case saw, comparisons, plain values.

`grader.api` gathers them, with the fixtures and the process groups, for checks modules."""
