"""process.leave: the operator's exit with a daemon thread still running (a rollup abandoned on SIGTERM).

CPython ends a daemon thread that wakes during the interpreter's finalization with pthread_exit; when the thread's
stack holds frames that cannot unwind (pydantic_core's, which the kubernetes client's API calls pass through), that
aborts the whole process. The operator's exit status was -6 after a clean stop in CI (a rollup's SavingsReport call
answered mid-finalization). The child here keeps a thread inside such a frame, waking every 0.2 ms.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import logging, sys, threading, time
from pydantic import validate_call
from stitchfleet.operator import process

@validate_call
def call(seconds: float) -> None:
    while True:
        time.sleep(seconds)

logging.basicConfig(level=logging.INFO, format="%(message)s")
if sys.argv[1] != "no thread":
    threading.Thread(target=call, args=(0.0002,), name="stitchfleet-rollup", daemon=True).start()
    time.sleep(0.05)
print("stopped")  # stdout is a pipe: block-buffered, so os._exit alone would lose this line
if sys.argv[1] != "interpreter's exit":
    sys.exit(process.leave(3))
"""


def _child(how: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True, env=env, timeout=60)


def test_a_thread_inside_an_api_call_does_not_abort_the_exit() -> None:
    control = _child("interpreter's exit")
    if control.returncode != -signal.SIGABRT:
        pytest.skip(f"this Python and pydantic end such a thread without aborting (status {control.returncode})")
    done = _child("leave")
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == "stopped\n"
    assert "exiting with 1 thread(s) still running, without finalization: stitchfleet-rollup" in done.stderr


def test_without_a_running_thread_the_interpreter_exits_as_usual() -> None:
    done = _child("no thread")
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == "stopped\n"
    assert "without finalization" not in done.stderr
