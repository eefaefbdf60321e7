"""Device profiles and the occupancy model."""

from __future__ import annotations

import pytest

from stitchfleet.compiler.devices import DeviceError, device, occupancy, relax_registers


def test_h200_two_full_blocks_per_sm() -> None:
    occ = occupancy(device("h200"), 1024)
    assert (occ.blocks_per_sm, occ.blocks_per_wave, occ.limited_by) == (2, 264, "threads per SM")


def test_v100_wave_and_smem_limit() -> None:
    v100 = device("V100")
    assert occupancy(v100, 1024).blocks_per_wave == 160
    occ = occupancy(v100, 256, smem=40 * 1024)
    assert (occ.blocks_per_sm, occ.limited_by) == (2, "shared memory per SM")


def test_registers_limit_blocks() -> None:
    occ = occupancy(device("h200"), 1024, registers=64)
    assert (occ.blocks_per_sm, occ.limited_by) == (1, "registers per SM")


def test_relax_keeps_blocks_per_wave() -> None:
    h200 = device("h200")
    assert relax_registers(h200, 1024, 0) == 32
    relaxed = relax_registers(h200, 256, 0)
    assert relaxed == 32  # 8 blocks of 256 threads need every register at 32/thread
    assert relax_registers(h200, 128, 0, assumed=32) == 32
    tiny = device("tiny")
    assert relax_registers(tiny, 128, 0) == 64
    assert occupancy(tiny, 128, 64).blocks_per_sm == occupancy(tiny, 128, 32).blocks_per_sm


def test_tiny_wave_is_small() -> None:
    assert occupancy(device("tiny"), 128).blocks_per_wave == 4


@pytest.mark.parametrize(
    ("threads", "registers", "smem", "message"),
    [
        (100, 32, 0, "not a multiple of 32"),
        (2048, 32, 0, "not a multiple of 32 up to 1024"),
        (1024, 300, 0, "exceeds the limit 255"),
        (1024, 32, 300 * 1024, "shared memory per block exceeds"),
        (1024, 255, 0, "no SM can hold"),
    ],
)
def test_bad_launches_are_named(threads: int, registers: int, smem: int, message: str) -> None:
    with pytest.raises(DeviceError, match=message):
        occupancy(device("h200"), threads, registers, smem)


def test_unknown_device() -> None:
    with pytest.raises(DeviceError, match=r"unknown device 'a100'.*h200"):
        device("a100")
