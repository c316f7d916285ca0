# The lab's two front doors:
#   make lab    set up, then serve JupyterLab with the exercises on 127.0.0.1:8888
#   make test   set up, then run every test
# and, for people who write exercises:
#   make exercises   regenerate exercises/ from solutions/ with nbgrader

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
PORT ?= 8888
ASSIGNMENT := multigpu

.PHONY: setup lab test lint exercises bench-grade clean

setup: $(READY)

$(READY): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(READY)

lab: $(READY)
	LAB_PYTHON=$(BIN)/python LAB_PORT=$(PORT) docker/start-lab

lint: $(READY)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check grader dplab tests conftest.py

test: $(READY) lint
	MPLBACKEND=Agg DPLAB_OFFLINE=1 $(BIN)/python -m pytest

exercises: $(READY)
	$(BIN)/python -m grader sync
	$(BIN)/nbgrader generate_assignment $(ASSIGNMENT) --force --no-db

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

bench-grade: $(READY)
	$(BIN)/python -m grader.bench --students 20 --jobs 2
