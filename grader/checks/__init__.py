"""Public checks, one module per exercise; students have them and run them. A checks module
imports `grader.api` alone (and its own exercise's modules)."""
