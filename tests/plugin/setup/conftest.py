"""The setup tests' isolation: what another test's run measured in the shared kernel cache is not theirs to weigh.

Input: the shared kernel cache (`tests.shared_cache`), which every hooked test's setup records into. Output: before
each test here, the cache's setup records without the `Measured` figures an earlier test's job added at its end
(`job_record.remembered`): a payback test told a step time would otherwise read a gain some other test measured on a
loaded machine, and pass or fail by the order the tests ran in.
"""

from __future__ import annotations

import json

import pytest

from stitchfleet.plugin.setup import setup_record
from tests.shared_cache import kernel_cache


@pytest.fixture(autouse=True)
def _no_measured_figures_of_other_tests() -> None:
    for path in (kernel_cache() / setup_record.RECORD_DIR).glob("*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.pop("measured", None) is not None:
            path.write_text(json.dumps(doc))
