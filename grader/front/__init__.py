"""Ways into the grader: the command line, the kernel's `check`, Gradescope, merge, the warm
server's commands and the pytest view (its options in pytest_options, which pytest loads
before it reads the command line). They reach the sandbox through the pipeline alone
(grader.grading, grader.class_grading, grader.pace), and may import the other layers below."""
