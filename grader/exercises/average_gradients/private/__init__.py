"""`average_gradients` on the instructor's side: its hidden checks (hidden.py) and catalogued
mistakes (mistakes.py), left out of the students' image and masked in every grading child.
They import `grader.api`, the exercises' public checks and `grader.exercises.catalogue`."""
