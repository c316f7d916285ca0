"""Sandbox: the fenced child that runs student code, and how the grader starts and watches
it. Imports load and the vocabulary; `GRADER_FAST=off` leaves out its fast path (the fork
server, helper children, extra children on idle cores)."""
