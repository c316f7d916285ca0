"""Ways into the grader: the command line, the kernel's `check`, Gradescope, merge, the warm
server's commands and the pytest view. They reach the sandbox through the pipeline alone
(grader.grading, grader.class_grading, grader.pace), and may import the other layers below."""
