"""Auto-attach (plugin.session.auto_attach): in a fresh interpreter per case, and the patched constructors."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.shared_cache import kernel_cache

ROOT = Path(__file__).resolve().parents[3]
JOB = Path(__file__).resolve().parents[1] / "boot_job.py"


def _start(tmp_path: Path, enabled: str, steps: int = 12) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_")}
    env.update(
        PYTHONPATH=str(ROOT),
        STITCHFLEET_ENABLED=enabled,
        STITCHFLEET_STATE_DIR=str(tmp_path),
        STITCHFLEET_CACHE_DIR=str(kernel_cache()),
        STITCHFLEET_JOB_UID="boot",
        STITCHFLEET_WARMUP_STEPS="1",
        STITCHFLEET_BASELINE_STEPS="2",
        STITCHFLEET_SLOWDOWN_MARGIN="1000",
        STITCHFLEET_PROBE_STEPS="2",  # every cluster runs from step 5 on (the group probe)
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    return subprocess.Popen(
        [sys.executable, str(JOB), str(steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(job: subprocess.Popen[str]) -> dict[str, str]:
    """The job's printed figures, once it exited 0 (bounded in time: a hung job is killed and fails the test)."""
    try:
        stdout, stderr = job.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate()
        raise
    assert job.returncode == 0, stderr[-3000:]
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


@pytest.mark.tf
def test_enabled_job_gets_the_hook_without_code_changes(tmp_path: Path) -> None:
    # The two jobs share nothing (state dirs apart; the disabled one compiles nothing): they run side by side, each a
    # process of its own as before, instead of one after the other on a 2-core machine whose second core was idle.
    enabled, disabled = _start(tmp_path, "1"), _start(tmp_path / "off", "0")
    try:
        out = _finish(enabled)
    finally:
        plain = _finish(disabled)
    assert out["tf-imported-by-boot"] == "False"
    assert "StitchHook" in out["hooks"].split(",")
    assert int(out["calls"]) > 0
    assert (tmp_path / "telemetry.db").exists()
    assert "StitchHook" not in plain["hooks"].split(",") and plain["calls"] == "0"
    on = [float(v) for v in out["losses"].split()]
    off = [float(v) for v in plain["losses"].split()]
    assert on == pytest.approx(off, rel=1e-4)


@pytest.mark.tf
def test_plugin_package_exposes_the_hook_lazily() -> None:
    code = (
        "import sys, stitchfleet.plugin as p; assert 'tensorflow' not in sys.modules;"
        " assert p.StitchHook.__name__ == 'StitchHook'"
    )
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=120)


@pytest.mark.tf
@pytest.mark.parametrize("kind", ["SingularMonitoredSession", "MonitoredSession"])
def test_hooks_given_positionally_keep_theirs_and_get_the_stitch_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Regression: the patched constructor added a `hooks` keyword to the caller's arguments, so
    `SingularMonitoredSession([hook])` or `MonitoredSession(creator, [hook])` (both as their signatures
    allow) failed the job with 'got multiple values for argument hooks'."""
    import tensorflow as tf

    from stitchfleet.plugin.session import auto_attach
    from stitchfleet.plugin.session.hook import StitchHook

    monkeypatch.setenv("STITCHFLEET_ENABLED", "1")
    monkeypatch.setenv("STITCHFLEET_STATE_DIR", str(tmp_path))
    original = getattr(tf.compat.v1.train, kind)
    module = types.ModuleType("sessions")  # patched as boot patches TF's module, the real class left alone
    setattr(module, kind, type(kind, (original,), {}))
    auto_attach.patch(module)
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [4], initializer=tf.compat.v1.zeros_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(w.assign_add(tf.ones([4])), step.assign_add(1))
        stop = tf.compat.v1.train.StopAtStepHook(last_step=3)
        cls = getattr(module, kind)
        session = (
            cls([stop]) if kind == "SingularMonitoredSession" else cls(tf.compat.v1.train.ChiefSessionCreator(), [stop])
        )
        with session:
            runs = 0
            while not session.should_stop():
                session.run(train)
                runs += 1
    hooks = session._hooks
    assert runs == 3 and stop in hooks and sum(isinstance(h, StitchHook) for h in hooks) == 1
