"""One folder per exercise, named by its id: checks.py (public: students have it and run it)
and private/ (hidden checks and catalogued mistakes: the instructor's side), with
`catalogue.py`, the catalogue's format. They import `grader.api` alone, and each other's
public checks."""
