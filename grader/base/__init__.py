"""The grader's base types: cases and checks, what a case saw, comparisons, plain values,
shared inputs, a network's recorded forward pass, the devices checks use, limits, tampering,
the messages between grader and child (protocol.py) and the verdicts (results.py).
`grader.api` gathers them for checks modules; they import dplab and labtext, nothing above."""
