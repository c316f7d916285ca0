"""Hidden checks, one module per exercise; they stay on the instructor's side, out of the
students' image. Like the public checks, they import `grader.api` alone."""
