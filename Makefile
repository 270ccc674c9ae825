# Every target installs what it needs into .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test docs bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,docs,examples,bench]"
	touch $@ $(VENV)/.installed-base

## The main job: the seed hierarchy X_0..X_9, exact, beside the naive recursion.
demo: $(VENV)/.installed-base
	$(BIN)/python -m hierax seed

## The test suite (parallel over both cores).
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n 2 -q

## The documentation site, built strictly into site/.
docs: $(VENV)/.installed-dev
	$(BIN)/mkdocs build --strict

## Benchmarks side by side (naive recursion, jax.experimental.jet, hierax).
bench: $(VENV)/.installed-dev
	$(BIN)/python -m hierax bench --out benchmarks/out

lint: $(VENV)/.installed-dev
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/ruff check src tests benchmarks examples

clean:
	rm -rf $(VENV) site .pytest_cache
