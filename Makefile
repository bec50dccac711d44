# One command each, from a fresh clone (Python 3.11 and Java 17 on the machine):
#   make demo   install into .venv and run the demo on a local directory
#   make test   install into .venv and run ruff, mypy (strict on s3stream/) and the whole suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO_DIR ?= $(CURDIR)/demo-data

.PHONY: install demo test test-core test-long lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	rm -rf $(DEMO_DIR)
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

bench: install
	$(BIN)/python bench/foundation_bench.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) build *.egg-info .mypy_cache .ruff_cache
