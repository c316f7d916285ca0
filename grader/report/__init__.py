"""Report: results per check and exercise, and the files they are written to."""
