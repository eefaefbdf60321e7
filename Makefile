# Two commands for users (make demo, make test), one for developers (make lint).
# Each creates .venv when missing and installs what it needs first; the stamps make
# later runs skip work that is already done (they are redone when setup.cfg changes).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
DEPS := $(VENV)/.stamp-deps
HOROVOD := $(VENV)/.stamp-horovod
SYSTEM := $(VENV)/.stamp-system
PYTEST_ARGS ?=
# The default tier leaves out the exhaustive sweeps (their fast slices stay in): `make test-sweeps` runs them.
TEST_MARKERS ?= not sweep
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test test-sweeps lint install clean-venv images

demo: $(DEPS) $(SYSTEM)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m stitchfleet.cli demo

test: $(DEPS) $(HOROVOD) $(SYSTEM)
	lint-imports
	@rc=0; $(PY) -m pytest -m "$(TEST_MARKERS)" $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure, not a pass" >&2; exit 1; fi; \
	exit $$rc

test-sweeps:
	$(MAKE) test TEST_MARKERS=sweep

lint: $(DEPS)
	ruff check stitchfleet tests scripts benchmarks
	ruff format --check stitchfleet tests scripts benchmarks
	mypy
	lint-imports

install: $(DEPS) $(HOROVOD) $(SYSTEM)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel

$(DEPS): setup.cfg pyproject.toml | $(PY)
	@echo "== installing stitchfleet with its tf, telemetry, operator and dev extras into $(VENV)"
	$(PIP) install --quiet -e '.[telemetry,tf,operator,dev]'
	touch $@

# Horovod builds against the installed TensorFlow, so it comes after it, without build isolation.
$(HOROVOD): $(DEPS)
	@if $(PY) -c 'import horovod.tensorflow' 2>/dev/null; then echo "== horovod already built"; else \
	  echo "== building horovod 0.28.1 against TensorFlow (about 3 minutes)"; \
	  command -v cmake >/dev/null || $(PIP) install --quiet cmake; \
	  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
	  HOROVOD_WITHOUT_MXNET=1 $(PIP) install --quiet --no-build-isolation --no-cache-dir horovod==0.28.1; fi
	touch $@

# PostgreSQL server binaries for the tests that start their own server.
$(SYSTEM): | $(PY)
	@sh scripts/install-system-deps.sh
	touch $@

# Operator and shim images as OCI archives under out/images (debootstrap + buildah, offline;
# BASE=registry builds FROM python:3.11-slim instead).
images:
	sh scripts/build_images.sh

clean-venv:
	rm -rf $(VENV)
