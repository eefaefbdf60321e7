"""The rank-summed decision vector as a typed record: its layout, and that sums of packed records unpack to the
sums of their fields (what Horovod's allreduce relies on)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from stitchfleet.plugin.control.decision_figures import DecisionFigures, GuardFigures, PairFigures
from stitchfleet.plugin.control.signature_decisions import SIGNATURE_SLOTS, SLOT


def _record(scale: float) -> DecisionFigures:
    signed = np.arange(SIGNATURE_SLOTS * SLOT, dtype=np.float64) * scale
    return DecisionFigures(
        (scale, 0.0, 2 * scale),
        GuardFigures(1.0, 0.0, 1.0, 0.003 * scale, 0.002 * scale, 0.0001),
        PairFigures(1.0, 0.004 * scale, 0.005, 0.0002, 0.0),
        PairFigures(0.0, 0.0, 0.0, 0.0, 1.0),
        signed,
    )


def test_the_record_packs_to_the_layout_and_back() -> None:
    record = _record(1.0)
    vector = record.pack()
    assert vector.dtype == np.float64 and len(vector) == 3 + DecisionFigures.EXTRA
    assert vector[:3].tolist() == [1.0, 0.0, 2.0]  # the cluster flags first
    assert vector[3:9].tolist() == [1.0, 0.0, 1.0, 0.003, 0.002, 0.0001]  # then the guard's figures
    assert vector[9] == 1.0 and vector[14:19].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]  # the pairs
    back = DecisionFigures.unpack(vector, 3)
    assert back.flags == record.flags and back.guard == record.guard
    assert back.cluster == record.cluster and back.group == record.group
    assert np.array_equal(back.signed, record.signed)


def test_a_sum_of_packed_records_unpacks_to_the_summed_fields() -> None:
    summed = DecisionFigures.unpack(_record(1.0).pack() + _record(2.0).pack(), 3)
    assert summed.flags == (3.0, 0.0, 6.0) and summed.guard.fault == 2.0 and summed.guard.fresh == 2.0
    assert summed.guard.stitched == pytest.approx(0.009) and summed.cluster.on == pytest.approx(0.012)
    assert summed.group.waiting == 2.0 and summed.signed[5] == pytest.approx(15.0)


def test_a_vector_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="decision vector"):
        DecisionFigures.unpack(np.zeros(2 + DecisionFigures.EXTRA), 3)
    assert DecisionFigures.fault_only(2).pack().tolist() == [0.0, 0.0, 1.0] + [0.0] * (DecisionFigures.EXTRA - 1)


def test_each_part_s_size_is_its_field_count() -> None:
    # pack and unpack place the parts by SIZE: a field added without it would shift every later figure
    assert len(fields(GuardFigures)) == GuardFigures.SIZE and len(fields(PairFigures)) == PairFigures.SIZE
