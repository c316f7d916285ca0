"""Ways into the grader: the command line, a class, the kernel's `check`, Gradescope, merge,
the warm server and the pytest plugin. They may import every layer below them."""
