"""Test tiers: gpu tests skip with a reason unless an NVIDIA GPU and pycuda are present.

tf, horovod and postgres tests run by default: `make test` installs what they need.
"""

from __future__ import annotations

import functools
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stitchfleet import settings
from stitchfleet.plugin.session import gc_pause
from stitchfleet.plugin.setup.setup_record import RECORD_DIR
from tests.shared_cache import kernel_cache


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA device is usable through pycuda, else why not."""
    try:
        import pycuda.driver as cuda
    except ImportError as err:
        return f"pycuda is not installed ({err}); GPU tests run on a GPU machine with `pip install .[gpu]`"
    try:
        cuda.init()
        if cuda.Device.count() == 0:
            return "pycuda sees no CUDA device"
    except Exception as err:  # pycuda raises its own error types for a missing driver
        return f"no usable CUDA driver: {err}"
    return None


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    """Each test sees the environment it sets: the process-wide settings cache is dropped around it."""
    settings.reset()
    yield
    settings.reset()


@pytest.fixture(autouse=True)
def thawed_heap() -> Iterator[None]:
    """A hook's begin freezes the heap until its end (gc_pause.py); a test that ends without its hook's end would
    leave every later test's garbage beside it uncollected."""
    yield
    gc_pause.thawed()


@pytest.fixture(autouse=True)
def worker_kernel_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that names no kernel cache gets the worker's (tests/shared_cache.py), never the user's: the demo's
    tests read ~/.cache/stitchfleet, whose setup records a `make demo` left made a 1200-step job set up where the test
    expects it skipped (CI, session 50), and wrote their own records there for the user's next job."""
    monkeypatch.setenv("STITCHFLEET_CACHE_DIR", str(kernel_cache()))


@pytest.fixture(autouse=True)
def no_job_history() -> None:
    """The shared kernel cache (tests/shared_cache.py) keeps its kernels across tests, not the jobs' history: the setup
    records a test's runs leave there (what a run measured, the step time its next run weighs its setup by) would make
    a later test's job of the same graph skip its setup."""
    shutil.rmtree(kernel_cache() / RECORD_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=f"gpu tier: {reason}"))


# `make test-unit`: the tier that runs without TensorFlow or Horovod. Their imports are blocked, so a test
# that needs them and is not marked fails loudly instead of quietly importing them.
WITHOUT_TF = "--without-tf"
MARKED_TF = re.compile(r"^pytestmark = .*\bmark\.(tf|horovod)\b", re.M)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(WITHOUT_TF, action="store_true", help="block TensorFlow and Horovod; skip modules marked tf")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(WITHOUT_TF):
        sys.modules["tensorflow"] = None  # type: ignore[assignment]
        sys.modules["horovod"] = None  # type: ignore[assignment]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption(WITHOUT_TF) and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return bool(MARKED_TF.search(collection_path.read_text())) or None
    return None
