"""Hidden checks, one module per exercise; they stay on the instructor's side."""
