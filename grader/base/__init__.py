"""The grader's base types: cases and checks, what a case saw, comparisons, plain values,
fixtures, a network's recorded forward pass, the devices checks use, time limits, tampering,
and the messages between grader and child (protocol.py). `grader.api` gathers them for
checks modules; they import dplab and labtext, nothing above them."""
