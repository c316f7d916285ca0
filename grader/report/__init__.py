"""Report: results per check and exercise, and the files they are written to (JSON, CSV,
Gradescope, the gradebook, text). Imports the judge's results and labtext."""
