"""The grader's base types: cases and checks, what a case saw, comparisons, plain values,
fixtures, the devices checks use, time limits and tampering. `grader.api` gathers them for
checks modules; they import dplab and labtext, nothing above them."""
