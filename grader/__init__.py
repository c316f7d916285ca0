"""The lab's grader: checks for every exercise, and the tools that run them. Its folders are
layers (docs/architecture.md): each imports only those below it, and dplab and labtext.

In a notebook:  from grader import check; check("allreduce", allreduce)
In a shell:     python -m grader check exercises/multigpu/from_scratch.ipynb --exercise allreduce
Instructors:    python -m grader grade SUBMISSION... --json results.json
"""


def check(exercise_id, function, hidden=False):
    """Run an exercise's checks on `function` in this kernel (grader.front.kernel)."""
    from grader.front.kernel import check_in_kernel as run

    return run(exercise_id, function, hidden)
