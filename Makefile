# corectl: the two commands of the README are `make lab` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
PYTHON ?= python3
MOLECULE_SCENARIOS ?=

.PHONY: setup lab lab-down test check lint pytest molecule image bench bench-fanout bench-stages

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Start the stand-in cluster (Docker engine and base image included) and provision it.
lab: setup
	corectl lab up --inventory lab
	corectl provision --inventory lab

lab-down: setup
	corectl lab down --inventory lab

# Every test: linters, pytest (unit + end-to-end on a stand-in lab), molecule per role; stages
# run side by side where they do not compete (tests/stages.py) and end with a time table.
test: setup
	python tests/stages.py all

# The inner loop: lint, then the unit and integration tests (no lab, no molecule): a few minutes.
check: setup
	python tests/stages.py check

lint: setup
	python tests/stages.py lint

image: setup
	corectl lab image

pytest: setup
	python tests/stages.py unit
	python tests/stages.py lab

# Each scenario's output is kept in build/molecule-<s>.log; strings listed in
# molecule/<s>/secret-patterns (test-only secrets) must not appear in it.
molecule: setup
	python tests/stages.py molecule $(MOLECULE_SCENARIOS)

# What a run costs and how it grows with the cluster (bench/fleet.py; docs/performance.md).
# Starts its own lab: not while the e2e test or `make lab` runs. BENCH_ARGS="--sizes 1,2".
bench: setup
	python bench/fleet.py $(BENCH_ARGS)

# What a lever of the test suite saves: one stage alternately in two variants (bench/stages.py;
# docs/testing.md). BENCH_ARGS="--stage molecule:slurm --a CORECTL_NODE_IMAGE=... --b CORECTL_NODE_IMAGE=...".
bench-stages: setup
	python bench/stages.py $(BENCH_ARGS)

# A no-op provision through ansible-runner's transmit | worker | process against a direct run
# (bench/fanout.py; docs/scale.md). On a converged site: `make lab` first.
bench-fanout: setup
	python bench/fanout.py $(BENCH_ARGS)
