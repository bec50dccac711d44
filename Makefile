# One command each, from a fresh clone (Python 3.11 and Java 17 on the machine):
#   make demo   install the library alone into .venv and run the demo on a local directory
#   make test   install the dev extra into .venv and run ruff, mypy (strict on s3stream/) and
#               the whole suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO_DEFAULT := $(CURDIR)/demo-data
DEMO_DIR ?= $(DEMO_DEFAULT)

.PHONY: install install-lib demo test test-core test-long lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# One stamp per install, redone when pyproject.toml changes: the demo needs the library only,
# the tests the dev extra (Spark, S3 servers, linters), the benchmarks also the bench extra.
$(VENV)/.installed-lib: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev,bench]'
	touch $@

install-lib: $(VENV)/.installed-lib

install: $(VENV)/.installed-dev

# The default directory is the demo's own, made afresh by each run (and ignored by git); one
# named with DEMO_DIR=... is never deleted (the demo refuses it unless it is empty).
demo: install-lib
	$(if $(filter $(DEMO_DEFAULT),$(DEMO_DIR)),rm -rf $(DEMO_DEFAULT))
	$(BIN)/s3stream demo $(DEMO_DIR)

lint: install
	$(BIN)/ruff check s3stream pyspark_s3stream tests bench examples
	$(BIN)/mypy s3stream pyspark_s3stream

test: lint
	$(BIN)/python -m pytest -q -ra

# The core suite alone: no Spark.
test-core: lint
	$(BIN)/python -m pytest -q -ra -m "not spark"

test-long: install
	S3STREAM_HYPOTHESIS_PROFILE=s3stream-long $(BIN)/python -m pytest -q -ra

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/foundation_bench.py

clean:
	rm -rf $(VENV) $(DEMO_DEFAULT) build *.egg-info .mypy_cache .ruff_cache
