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
# tensorflow==2.15.1's GPU wheel, headers and framework library only: CI builds the GPU op against them
TFGPU := $(VENV)/tf-gpu/tensorflow/VERSION
PYTEST_ARGS ?=
# pytest-xdist workers: CI's 2 cores. WORKERS=auto on a bigger machine; WORKERS=0 runs in one process (pdb, -x).
# loadgroup: tests marked xdist_group("name") run on one worker, one after another (horovod's 2-rank jobs, builds that
# several tests share); it needs pytest below 9.2 (setup.cfg; tests/test_worker_groups.py checks it).
# Both tiers run on the two workers: the default tier passed whole on them twice in a row (session 38,
# docs/testing.md), against 28-43 minutes of CI in one process. TEST_WORKERS=0 for one process.
WORKERS ?= 2
TEST_WORKERS ?= $(WORKERS)
# The default tier leaves out the exhaustive sweeps (their fast slices stay in): `make test-sweeps` runs them.
TEST_MARKERS ?= not sweep
# The slowest tests in every CI log: they say where the default tier's pytest time goes, which is to stay under 20
# minutes on CI's 2 cores (11 min on the two workers of the 2-core dev machine in session 38: docs/testing.md).
TEST_REPORT ?= --durations=30 --durations-min=10
# C, C++ and CUDA shipped as package data: `make lint` checks their format (.clang-format)
NATIVE_SOURCES = $(shell find stitchfleet -name '*.c' -o -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test test-unit test-sweeps lint install clean-venv images

demo: $(DEPS) $(SYSTEM)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m stitchfleet.cli demo

test: $(DEPS) $(HOROVOD) $(SYSTEM) $(TFGPU)
	lint-imports
	@rc=0; $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "$(TEST_MARKERS)" $(TEST_REPORT) $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure, not a pass" >&2; exit 1; fi; \
	exit $$rc

# The fast loop: no TensorFlow, Horovod, PostgreSQL or C++ builds of cuda-cpu (docs/testing.md has its time).
UNIT_MARKERS := not tf and not horovod and not postgres and not cuda_cpu and not gpu and not slow and not sweep
test-unit: $(DEPS)
	$(PY) -m pytest -q -n $(WORKERS) --dist loadgroup --without-tf -m "$(UNIT_MARKERS)" $(PYTEST_ARGS)

test-sweeps:
	$(MAKE) test TEST_MARKERS=sweep

lint: $(DEPS)
	ruff check stitchfleet tests scripts benchmarks
	ruff format --check stitchfleet tests scripts benchmarks
	mypy
	lint-imports
	clang-format --dry-run --Werror $(NATIVE_SOURCES)

install: $(DEPS) $(HOROVOD) $(SYSTEM)

$(TFGPU): $(DEPS)
	$(PY) scripts/tf_gpu_headers.py $(VENV)/tf-gpu

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
