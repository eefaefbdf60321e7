"""Every cluster of the small DIEN model mapped at TF granularity, rewired, and trained to the same losses."""

from __future__ import annotations

import numpy as np
import pytest

from tests.plugin.site_harness import model_graph, stitch, train

pytestmark = pytest.mark.tf

STEPS = 8


def test_small_dien_is_stitched_whole_and_trains_to_the_same_losses() -> None:
    stitched = stitch(model_graph("dien_attention_gru", "small"))
    assert not stitched.refused, stitched.refused
    regrouped = [s for s in stitched.sites if s.graph.metadata.get("regrouped")]
    assert regrouped, "no cluster needed redrawing at TF op granularity: the test no longer covers it"
    plain = train(stitched, STEPS, on=False)
    fused = train(stitched, STEPS, on=True)
    np.testing.assert_allclose(fused, plain, rtol=2e-5)
    assert plain[-1] < plain[0]  # it trains
    assert all(k.calls == STEPS for k in stitched.kernels), "a stitched kernel did not run every step"
    assert all(k.bad is None and k.fallbacks == 0 for k in stitched.kernels)
