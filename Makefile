# The two commands: `make up` brings the lab up on this machine, `make test` runs the tests.
# Both create and fill the virtualenv (.venv) first, and build the model artifacts if needed.
PY := .venv/bin/python
# Which of pyproject.toml's extras the virtualenv gets (scripts/bootstrap.sh): the tests' (`dev`, all of
# it) for the tests, lint and the lock, and for plain `make setup`; the instructor's for `make notebooks`
# (nbgrader, jupytext); for everything else, `make up` first, the student's laptop (`lab`). A
# virtualenv that has a larger extra keeps it.
SETUP_EXTRA ?= $(if $(filter setup test test-fast test-notebook format lock,$(MAKECMDGOALS)),dev,$(if $(filter notebooks,$(MAKECMDGOALS)),instructor,lab))
# Passed through to `servelab artifacts` to serve a trained checkpoint instead of untrained weights.
export FOOD11_CHECKPOINT FOOD11_CHECKPOINT_SHA256 FOOD11_CHECKPOINT_GIT_BLOB

.PHONY: up test test-fast test-notebook test-docker docker-build test-gpu test-gpu-notebook6 check-class bench bench-quick notebooks format setup lock artifacts clean help

up: artifacts  ## start JupyterLab, FastAPI (PyTorch, ONNX), Triton, Ray Serve and GourmetGram on 127.0.0.1 (ready in about 35 s once set up); Ctrl-C stops all
	$(PY) -m servelab up $(if $(UI_BACKEND),--ui-backend $(UI_BACKEND))

# When make began: `make test` ends with its whole time, the virtualenv and the artifacts included
# (pytest's own summary above it gives its wall time and its five slowest items).
MAKE_STARTED := $(shell date +%s)

test: artifacts  ## unit and integration tests (real servers on 127.0.0.1), then every notebook (nbmake): 25 to 60 minutes on 2 cores, as busy as the machine is
	@$(PY) -m pytest $(PYTEST_ARGS); status=$$?; \
	echo "make test: $$(( $$(date +%s) - $(MAKE_STARTED) )) s in all, set-up included (exit $$status)"; exit $$status

test-fast: artifacts  ## the day-to-day lane: unit tests and lint, no server started (under 2 minutes)
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

test-notebook: artifacts  ## one notebook against the lab, as `make test` runs it (nbmake; 10 s to about 4 minutes): make test-notebook NOTEBOOK=9_concurrency_target
	@test -f "notebooks/$(NOTEBOOK).ipynb" || { echo "NOTEBOOK=$(NOTEBOOK) is not one of: $(basename $(notdir $(wildcard notebooks/[0-9]*.ipynb notebooks/appendix_*.ipynb)))" >&2; exit 2; }
	$(PY) -m pytest "notebooks/$(NOTEBOOK).ipynb" $(PYTEST_ARGS)

test-docker: setup  ## the Compose project for real, CPU variant: build, up, notebooks 3 and 5 and tests/test_compose.py in its Jupyter, tear down (about 4 minutes with the images built; a first build adds 5-20)
	bash scripts/test_docker.sh

docker-build: setup  ## only the Docker engine and the Compose project's images (CPU variant), as test-docker builds them (5-20 minutes the first time, a minute after)
	bash scripts/test_docker.sh --build-only

# The GPU check runs with the Python that has torch: the lab's virtualenv where there is one, else the
# machine's own (a bare GPU machine: docs/gpu-check.md says what to bring). It creates nothing.
PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)

test-gpu:  ## the GPU check (about 5 minutes): services and Triton on the GPU, their verdicts, speed and GPU memory; exit 2 without a GPU
	$(PYTHON) -m servelab.bench.gpu_check $(if $(TRITON_SERVER_BIN),--tritonserver $(TRITON_SERVER_BIN)) $(GPU_CHECK_ARGS)

test-gpu-notebook6:  ## notebook 6's claims on the GPU (113 s on a 2-core CPU; not yet timed on a GPU): a batch of 16 against 1, and 1, 2, 4 Triton instances against the GPU's busy share
	$(PYTHON) -m servelab.bench.gpu_check.notebook6 $(if $(TRITON_SERVER_BIN),--tritonserver $(TRITON_SERVER_BIN)) $(GPU_CHECK_ARGS)

# Standard library only, with the machine's Python where there is no virtualenv: an instructor runs it anywhere.
check-class:  ## before class: the lock's torch and torchvision on PyTorch's CUDA 12.6 index for each image's Python, and every base image's tag in its registry; says what to change (seconds; exit 2 where they cannot be reached)
	$(PYTHON) scripts/check_class.py $(CHECK_CLASS_ARGS)

bench: artifacts  ## the headline benchmark (about 35 minutes): goals judged at c=64; report in results/bench-<time>-full/
	$(PY) -m servelab bench --profile full

bench-quick: artifacts  ## the same steps, briefly (about 7 minutes): proves the pipeline, not the speed
	$(PY) -m servelab bench --profile quick

notebooks: setup  ## regenerate notebooks/*.ipynb from their sources (notebooks/*.py; seconds)
	$(PY) scripts/build_notebooks.py

format: setup  ## fix what ruff can (lint and format; seconds); `make test` checks that nothing is left
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

setup:  ## virtualenv at the lock's versions (the tests' extra; `make up` installs the student's), and the system libraries perf_analyzer and Triton need (about 5 minutes the first time, docs/local.md; a second when nothing changed)
	@bash scripts/bootstrap.sh $(SETUP_EXTRA)

# uv's resolver (pyproject.toml's `dev` extra installs it) for this platform and Python 3.11.2, Debian
# 12's, the oldest 3.11 the lab meets (a Debian 12 virtualenv, the Docker stand-ins' base): a release
# that needs a newer 3.11 would not install there. It keeps each pin of the lock that pyproject.toml
# still allows (LOCK_ARGS=--upgrade: the newest).
UV_COMPILE := .venv/bin/uv pip compile pyproject.toml --python-version 3.11.2 --system-certs --quiet --custom-compile-command "make lock"
# requirements-cpu.lock, for a virtualenv without an NVIDIA GPU (scripts/bootstrap.sh): PyTorch's CPU
# builds (torch==X+cpu, from its own index) require what the registry's builds of the same release
# require, less these, which only its CUDA build needs (the Requires-Dist of torch 2.13.0+cpu and of
# the registry's 2.14.1, compared). So that lock is requirements.lock's resolution without them, at
# its pins, with torch and torchvision named +cpu: PyTorch's index need not answer to write it.
TORCH_CUDA_ONLY := cuda-toolkit nvidia-cudnn-cu13 nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvshmem-cu13 triton

lock: setup  ## requirements.lock from pyproject.toml: every version the lab installs, pinned; requirements-cpu.lock, its PyTorch CPU builds (seconds)
	$(UV_COMPILE) --all-extras -o requirements.lock $(LOCK_ARGS)
	cp requirements.lock requirements-cpu.lock
	printf '%s\n' $(TORCH_CUDA_ONLY) | $(UV_COMPILE) --all-extras --excludes /dev/stdin -o requirements-cpu.lock
	sed -i -E 's/^(torch|torchvision)==([^+]+)$$/\1==\2+cpu/' requirements-cpu.lock
	# Triton's image runs Ubuntu 22.04's Python 3.10, for which some of the newest releases have no build.
	.venv/bin/uv pip compile pyproject.toml --extra triton --python-version 3.10 --system-certs --quiet \
		--custom-compile-command "make lock" -o docker/triton-py310.lock $(LOCK_ARGS)

artifacts: setup  ## the model files (food11.pth, food11.onnx), placed where each service and Triton model loads them (about a minute; seconds once built)
	$(PY) -m servelab artifacts

clean:  ## remove generated files (artifacts, staged Triton repository, logs; seconds); keeps .venv
	rm -rf .lab
	git clean -fX -- fastapi_pt fastapi_onnx gourmetgram models_staging

help:  ## this list: each target, what it does and how long it takes
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-z0-9-]+:[^#]*## / {printf "  make %-19s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
