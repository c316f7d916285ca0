"""The maintainers' measures: `make bench-*` and `make gpu-check`."""
