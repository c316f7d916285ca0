"""A class's JupyterHub: the logins, the spawners and the labs' limits (lab_hub, lab_groups,
closed), the hub's config (jupyterhub_config, run by `jupyterhub -f`), nbgrader's collect and
release of feedback for the instructor (lab_exchange, lab_feedback), and the helpers of its
tests and benchmark (running, bench, clear). It may import the grader's loader and manifest;
nothing of the lab imports it."""
