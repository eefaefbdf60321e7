"""The native TF op prebuilt into the shim (`stitchfleet shim install DIR --with-op`): a pod loads it
without a compiler and without compiling; another TF version or other flags never load it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stitchfleet.plugin.native import dispatch_op

# on one xdist worker with test_dispatch_gpu_op's readers of the shim: conftest.py's build is once per worker, and
# two workers built it twice (110 s and 68 s on the loaded 2-core machine)
pytestmark = [pytest.mark.tf, pytest.mark.slow, pytest.mark.xdist_group("prebuilt_shim")]
USER_SCRIPT = Path(__file__).resolve().parents[1] / "user_script.py"


@pytest.fixture
def shim(prebuilt_shim: Path) -> Path:
    """The session's `shim install --with-op` (conftest.py): test_dispatch_gpu_op reads its GPU variant too."""
    return prebuilt_shim


def test_the_op_is_prebuilt_under_a_name_of_its_tf(shim: Path) -> None:
    built = sorted(path.name for path in (shim / "ops").glob("tfop-*.so"))
    # the CPU wheel's build and the GPU wheel's (-DGOOGLE_CUDA=1) of this TF version
    assert built == sorted([dispatch_op.prebuilt_name(gpu=False), dispatch_op.prebuilt_name(gpu=True)])
    assert dispatch_op.prebuilt_name() in built


def test_the_name_is_the_abi_not_where_tf_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod's TF lives in another site-packages than the image builder's: the same op must match."""
    here = dispatch_op.prebuilt_name()
    flags = dispatch_op.tf.sysconfig.get_compile_flags()
    moved = ["-I/elsewhere/site-packages/tensorflow/include" if f.startswith("-I") else f for f in flags]
    monkeypatch.setattr(dispatch_op.tf.sysconfig, "get_compile_flags", lambda: moved)
    assert dispatch_op.prebuilt_name() == here
    monkeypatch.setattr(dispatch_op.tf.sysconfig, "get_compile_flags", lambda: [*moved, "-D_GLIBCXX_USE_CXX11_ABI=0"])
    assert dispatch_op.prebuilt_name() != here  # a define is the ABI: another name


def test_a_prebuilt_op_is_loaded_without_compiling(shim: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compiler(*args: object) -> bytes:
        raise AssertionError("the op was compiled")

    monkeypatch.setattr(dispatch_op, "_build", no_compiler)
    monkeypatch.setattr(dispatch_op, "_compiler_version", no_compiler)
    monkeypatch.setattr(dispatch_op, "prebuilt_dirs", lambda: [shim / "ops"])
    assert dispatch_op.library_path(tmp_path / "empty-cache") == shim / "ops" / dispatch_op.prebuilt_name()


def test_a_pod_without_a_cpp_compiler_runs_the_native_op_from_the_shim(shim: Path, tmp_path: Path) -> None:
    """The clusters' C still needs `cc` on a CPU job (a GPU job compiles with NVRTC); the op's C++ build,
    TF headers and all, is what the shim saves: here there is no c++ at all, and the native op runs."""
    tools = tmp_path / "tools"
    tools.mkdir()
    gcc = shutil.which("gcc")
    assert gcc is not None
    for name in ("cc", "as", "ld"):  # gcc runs the assembler and linker it finds on PATH
        found = gcc if name == "cc" else shutil.which(name)
        assert found is not None
        (tools / name).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STITCHFLEET_", "PYTHONPATH"))}
    env.update(
        PATH=str(tools),
        PYTHONPATH=str(shim / "shim"),
        STITCHFLEET_ENABLED="1",
        STITCHFLEET_STATE_DIR=str(tmp_path / "state"),
        STITCHFLEET_CACHE_DIR=str(tmp_path / "cache"),
        STITCHFLEET_BRIDGE="native",
        STITCHFLEET_JOB_UID="prebuilt",
        STITCHFLEET_WARMUP_STEPS="2",
        STITCHFLEET_BASELINE_STEPS="3",
        STITCHFLEET_PROBE_STEPS="0",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    done = subprocess.run(
        [sys.executable, str(USER_SCRIPT), "20"], env=env, capture_output=True, text=True, timeout=400, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with sqlite3.connect(tmp_path / "state" / "telemetry.db") as connection:
        modes = dict(connection.execute("SELECT mode, SUM(iterations) FROM step_windows GROUP BY mode").fetchall())
        failures = connection.execute("SELECT reason FROM events WHERE kind = 'compile_failure'").fetchall()
    assert modes.get("stitched", 0) > 0, (modes, failures, done.stderr[-2000:])
    assert not any("plugin setup failed" in reason for (reason,) in failures)
