"""`make test-unit` collects: every test module that imports TensorFlow or Horovod is marked so.

Input: the Makefile's unit-tier markers. Output: pytest's collection of the repository with `--without-tf`
(TensorFlow and Horovod blocked) in a child process, which must report no collection error. A test module that
imports the plugin's TF-bound parts without `pytestmark = pytest.mark.tf` broke the tier once (session 10's
tests/plugin/guard/test_translation_inputs.py); `make test` alone never noticed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def unit_markers() -> str:
    found = re.search(r"^UNIT_MARKERS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile defines no UNIT_MARKERS"
    return found.group(1).strip()


# slow (a second whole collection, ~12 s): `make test` runs it; in `make test-unit` the session's own collection is
# the same check (a collection error fails that run).
@pytest.mark.slow
def test_the_unit_tier_collects_without_tensorflow() -> None:
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "--without-tf", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, "-m", unit_markers()], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    errors = [line for line in done.stdout.splitlines() if line.startswith("ERROR ")]
    assert done.returncode == 0 and not errors, "\n".join(errors) or done.stdout[-3000:] + done.stderr[-2000:]
