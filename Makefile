# corectl: the two commands of the README are `make lab` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
PYTHON ?= python3
MOLECULE_SCENARIOS ?= $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))

.PHONY: setup lab lab-down test lint pytest molecule image

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

# Every test: linters, pytest (unit + end-to-end on a stand-in lab), molecule per role.
test: lint pytest molecule

lint: setup
	ruff check src tests bench
	ruff format --check src tests bench
	ansible-lint

image: setup
	corectl lab image

pytest: image
	pytest -ra

# Each scenario's output is kept in build/; strings listed in molecule/<s>/secret-patterns
# (test-only secrets) must not appear in it.
molecule: image
	@set -e; mkdir -p build; image=$$(corectl lab image); for s in $(MOLECULE_SCENARIOS); do \
	  echo "=== molecule test -s $$s"; \
	  CORECTL_NODE_IMAGE=$$image molecule test -s $$s 2>&1 | tee build/molecule-$$s.log; \
	  if [ $${PIPESTATUS[0]} -ne 0 ]; then echo "=== molecule scenario $$s failed; the failing tasks:"; \
	    grep -aE -A12 'fatal: |failed: \[|FAILED!|ERROR!' build/molecule-$$s.log | tail -80; exit 1; fi; \
	  if [ -f molecule/$$s/secret-patterns ] && grep -aFf molecule/$$s/secret-patterns build/molecule-$$s.log; then \
	    echo "=== molecule scenario $$s: a secret appeared in the output"; exit 1; fi; \
	  echo "=== molecule scenario $$s: passed"; done
