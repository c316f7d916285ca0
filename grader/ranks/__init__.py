"""Run a case in every process of a fresh process group, and note the torch.distributed calls
the student's code makes there. The checks of the distributed notebook share it. It imports
dplab's launcher and the grader's base.

A case calls `in_every_size(factory, student)` (groups.py): for each group size,
`factory(student)()` runs in each process of a new group of processes forked from the grading
child (dplab.rank, on gloo); the groups run side by side (launching.py). What each returns
comes back as plain data. A group that deadlocks, crashes or runs past its limits does not end
the case: its record says what happened, which the checks turn into a failure that names the
rank (judging.py: `every_rank`, `expect_ranks_finished`). recording.py notes the
torch.distributed calls made meanwhile.

Forking a process that has imported torch costs some 30 ms of processor time, and a case
needs 9 processes. So the cases of a notebook's exercises share their processes
(pools.py, over rankpool.py's ranks that serve one order after another): each size's are
forked at the first case that needs them, and every case still
gets a new process group, the random states the case had, and processes that no case has
failed in, stopped, or changed (a case that changes the grader's code or torch in a rank
fails there). An exercise whose cases hold names right with the reference's uses them too,
and they stop at its end (`reference_in_ranks`): no rank that has seen the reference serves
another exercise.

Nothing here solves an exercise: it starts processes, draws inputs from seeds and records.
"""
