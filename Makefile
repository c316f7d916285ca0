# The lab's two front doors:
#   make lab    set up what students use, then serve JupyterLab on 127.0.0.1:8888
#   make test   set up everything, then run every test (and print the slowest)
#   make hub    JupyterHub for a class on this machine (docs/hub.md); make hub-setup installs it
#   make hub-clear   after the course: list the students' accounts the hub made; YES=1 removes
#                    them, their homes and their files elsewhere (keeping the exchange)
# and, for people who write exercises or maintain the lab:
#   make test-quick   the tests that start no grader, nbgrader, kernel or JupyterLab
#   make bench-grade, bench-notebooks, bench-distributed, bench-hub, bench-shards   figures, printed
#                    (never tested)
#   make exercises   regenerate exercises/ from solutions/ with nbgrader
#   make picture     redraw the README's picture (docs/check-in-the-lab.png) from a real check
#   make render LANG=zh_CN   run a language's notebooks on the sample, as HTML in build/render/
#   make lock        re-resolve requirements/*.txt from pyproject.toml (needs the network)
#   make images      build the lab and grader images and probe them (tests/test_images.py)
#   make gpu-check   on a machine with NVIDIA GPUs: the tests that need them, the class graded
#                    with and without CUDA, the book's timings, NCCL; a table and
#                    gpu-check.json (PYTHON=... names a Python that already has PyTorch)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB_READY := $(VENV)/.lab
DEV_READY := $(VENV)/.dev
PORT ?= 8888
GPU_CHECK_JSON ?= gpu-check.json
ASSIGNMENT := multigpu
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: setup lab test test-quick lint exercises bench-grade bench-notebooks bench-distributed bench-hub bench-shards \
	lock images clean picture render hub hub-setup hub-clear gpu-check

setup: $(DEV_READY)

# A Python of 3.11 or newer with venv, or a message that says what to install.
$(BIN)/python:
	@docker/check-python "$(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

$(LAB_READY): requirements/lab.txt pyproject.toml | $(BIN)/python
	$(PIP) -r requirements/lab.txt
	$(PIP) --no-deps -e .
	touch $@

# The lab's messages in each language: i18n/<language>/messages/*.po compiled (labtext/__init__.py).
CATALOGUES := $(patsubst i18n/%/messages,labtext/locale/%/LC_MESSAGES/lab.mo,$(wildcard i18n/*/messages))
$(CATALOGUES): $(wildcard i18n/*/messages/*.po) | $(LAB_READY)
	$(BIN)/python -m grader messages compile

$(DEV_READY): requirements/dev.txt $(LAB_READY)
	$(PIP) -r requirements/dev.txt
	touch $@

# The notebooks' language: `make lab LANG=zh_CN` (or a zh_CN locale) serves the Chinese ones.
LAB_LANG ?= $(if $(filter zh_CN%,$(LANG)),zh_CN,)
lab: $(LAB_READY) $(CATALOGUES)
	LAB_PYTHON=$(BIN)/python LAB_PORT=$(PORT) LAB_LANG=$(LAB_LANG) docker/start-lab

# A class's JupyterHub: the hub's packages beside the lab's, and its proxy (Node.js) from the lock.
HUB_READY := $(VENV)/.hub
PROXY := hub/node_modules/.bin/configurable-http-proxy
$(HUB_READY): requirements/hub.txt $(LAB_READY)
	$(PIP) -r requirements/hub.txt
	touch $@

$(PROXY): hub/package.json hub/package-lock.json
	@command -v npm >/dev/null || { echo "make: the hub's proxy needs Node.js 18 or newer and npm (Debian, Ubuntu: apt install nodejs npm)" >&2; exit 2; }
	cd hub && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Run by root with the process spawner, the hub lends the students' accounts a Python of its own,
# made once for each version of the lab in HUB_PYTHON_FOLDER (/var/lib/multigpu-lab/python) from
# the system's Python, so that no lab runs the checkout's .venv, wherever it lies.
hub-setup: $(HUB_READY) $(PROXY) $(CATALOGUES)

hub: hub-setup
	$(BIN)/jupyterhub -f hub/jupyterhub_config.py

hub-clear: $(HUB_READY)
	$(BIN)/python -m hub.clear $(if $(YES),--yes) --yes-is YES=1

lint: $(DEV_READY)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check grader dplab labtext hub tests conftest.py

# One PyTorch thread per process in the tests (the grading children use one anyway): with two,
# another program keeping one core busy made the notebook kernels crawl while the threads
# spun waiting for each other, past the tests' time limits; one thread just gets a core.
PYTEST := MPLBACKEND=Agg DPLAB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest
# Test files run side by side on two workers (pytest-xdist), each file's tests together in one
# worker, so that a module's fixtures (a graded class, an nbgrader course) are made once, the
# longest first (tests/conftest.py orders them). WORKERS=1 runs them one at a time.
WORKERS ?= 2
PARALLEL := $(if $(filter 1,$(WORKERS)),,-n $(WORKERS) --dist loadfile --no-loadscope-reorder)

# The hub's tests need its proxy. Without npm they say so and skip, and make says so first;
# on CI (CI=true) the proxy is built whatever, so a missing npm fails the run.
HUB_PROXY := $(if $(or $(shell command -v npm),$(filter true 1 yes,$(CI))),$(PROXY))
NO_PROXY_SAID = $(if $(HUB_PROXY),,@echo "make: no npm here, so the hub's proxy is not built and the hub's tests will skip (Debian, Ubuntu: apt install nodejs npm)" >&2)
test: $(DEV_READY) $(CATALOGUES) $(HUB_PROXY) lint
	$(NO_PROXY_SAID)
	$(PYTEST) $(PARALLEL) --durations=15 --record-durations=build/test-durations.json

test-quick: $(DEV_READY) $(CATALOGUES) $(HUB_PROXY) lint
	$(NO_PROXY_SAID)
	$(PYTEST) $(PARALLEL) -m "not slow and not container" --durations=5

# Both releases: exercises/ from solutions/, and each language's from solutions/ translated by
# i18n/<language>/ (the translated sources are written under build/, never edited).
LANGUAGES := zh_CN
exercises: $(DEV_READY)
	$(BIN)/python -m grader sync
	$(BIN)/nbgrader generate_assignment $(ASSIGNMENT) --force --no-db
	for lang in $(LANGUAGES); do \
		rm -rf build/$$lang && \
		$(BIN)/python -m grader translate $$lang build/$$lang/solutions && \
		LAB_RELEASE_LANGUAGE=$$lang $(BIN)/nbgrader generate_assignment $(ASSIGNMENT) \
			--force --no-db --CourseDirectory.source_directory=build/$$lang/solutions \
			--CourseDirectory.release_directory=exercises/$$lang || exit 1; \
	done

# The README's picture: a check cell and its output for a catalogued mistake, run in a kernel.
picture: $(LAB_READY)
	$(BIN)/python docs/make_picture.py

# A language's reference notebooks run end to end on the sample, as HTML under build/render/.
render: $(DEV_READY) $(CATALOGUES)
	$(BIN)/python docs/render_notebooks.py $(or $(LAB_LANG),en)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

bench-grade: $(DEV_READY)
	$(BIN)/python -m grader.benchmarks.grade --students 20 --jobs 2

bench-notebooks: $(DEV_READY)
	$(BIN)/python -m grader.benchmarks.notebooks

# A class's hub: login to a usable lab, and the memory of idle labs (STUDENTS=8 of them).
STUDENTS ?= 8
bench-hub: $(DEV_READY) $(CATALOGUES) $(PROXY)
	$(BIN)/python -m hub.bench --students $(STUDENTS)

# A class of 20 graded here, and as a Slurm job array of 1, 2 and 4 slices on a one-node
# cluster that it starts (root, slurm-wlm and munge).
bench-shards: $(DEV_READY) $(CATALOGUES)
	$(BIN)/python -m tests.bench_shards

# All-reduce bus bandwidth of the ring, per-parameter, bucketed and torch's own, 4 KiB to 64 MiB;
# then, for DDP and ZeRO stages 1 to 3 at 2, 3 and 4 ranks, the bytes rank 0 sends per step and
# holds, beside the ZeRO paper's formulas.
bench-distributed: $(DEV_READY)
	$(BIN)/python -m grader.benchmarks.bandwidth
	$(BIN)/python -m grader.benchmarks.sharding

# One universal lock per role, for every Python from 3.11 and every platform: lab.txt is what
# students run (the lab image, `make lab`); hub.txt is a class's JupyterHub (`make hub`, the hub
# image); dev.txt adds both and the project's own tools. lab.txt and hub.txt are
# resolved within dev.txt, so the versions they share agree.
UV_COMPILE := $(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command "make lock" pyproject.toml
lock: $(DEV_READY)
	$(UV_COMPILE) --group dev -o requirements/dev.txt
	$(UV_COMPILE) -c requirements/dev.txt -o requirements/lab.txt
	$(subst pyproject.toml,--group pyproject.toml:hub,$(UV_COMPILE)) -c requirements/dev.txt \
		-o requirements/hub.txt

# Build the lab and grader images and probe them (root with buildah and podman, or Docker).
images: $(DEV_READY)
	$(PYTEST) -m container tests/test_images.py -v -s

# The tests marked gpu (and multigpu, which skip below two GPUs), on the real CUDA path. GPU
# machines often bring their own PyTorch, so this runs PYTHON as it is, with the repository on
# its path; it needs pytest, pytest-timeout and nbformat beside PyTorch.
gpu-check:
	@$(PYTHON) -c 'import sys, torch; n = torch.cuda.device_count(); print(f"gpu-check: {n} CUDA GPU(s), torch {torch.__version__}, Python {sys.version.split()[0]}"); sys.exit(0 if n else "gpu-check: no CUDA GPU here")'
	MPLBACKEND=Agg DPLAB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} \
		$(PYTHON) -m grader.benchmarks.gpu_check --json $(GPU_CHECK_JSON) $(GPU_CHECK_ARGS)
