"""Host arrays <-> the bytes a GPU buffer holds, and the co-residency check for grid barriers.

Input: a kernel IR `Buffer` and a host array (numpy; bf16 is held in float32 on the
host, as `evaluate` and the sim hold it), or raw device bytes; the device's limits
and a compiled function's resources. Output: the device representation (bf16 as its
16-bit pattern, rounded to nearest even), the host array back, and how many blocks
of a launch fit on the device at once. No CUDA library needed: the cuda backend
uses these, and CI tests them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.devices import Device, DeviceError, occupancy
from stitchfleet.compiler.evaluate import round_bf16
from stitchfleet.compiler.ir.types import DType
from stitchfleet.compiler.kernel import ir

RESERVED_SMEM_PER_BLOCK = 1024  # the CUDA runtime's own shared memory per resident block on sm_80 and newer


class DeviceArrayError(ValueError):
    """A host array does not match the buffer it is meant for."""


def device_dtype(dtype: DType) -> np.dtype[Any]:
    """The numpy type with the device's element layout (bf16: its 16-bit pattern as uint16)."""
    return np.dtype(np.uint16) if dtype is DType.BF16 else dtype.numpy


def to_device(buf: ir.Buffer, value: Any) -> npt.NDArray[Any]:
    """A flat, contiguous array whose bytes are what `buf` holds on the device."""
    array = np.asarray(value)
    if array.size != buf.size:
        raise DeviceArrayError(f"buffer {buf.name!r}: got {array.size} elements, expected {buf.size}")
    if buf.dtype is DType.BF16:
        rounded = round_bf16(array.astype(np.float32).reshape(-1))
        return np.ascontiguousarray((rounded.view(np.uint32) >> 16).astype(np.uint16))
    if array.dtype != buf.dtype.numpy:
        raise DeviceArrayError(f"buffer {buf.name!r}: got {array.dtype}, expected {buf.dtype.numpy}")
    return np.ascontiguousarray(array.reshape(-1))


def from_device(buf: ir.Buffer, raw: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The host form of device bytes read back (bf16 widened to float32)."""
    if buf.dtype is DType.BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw


def resident_blocks(dev: Device, block: int, registers: int, smem: int, reserved: int = 0) -> int:
    """Blocks of this launch that the whole device holds at once (0 when a block does not fit)."""
    try:
        return occupancy(dev, block, max(registers, 1), smem + reserved).blocks_per_wave
    except DeviceError:
        return 0


def check_coresident(name: str, grid: int, fits: int) -> None:
    """A grid barrier with more blocks than fit at once would hang the GPU: refuse it before launching."""
    if grid > fits:
        raise DeviceArrayError(
            f"kernel {name!r} has a grid barrier and {grid} blocks, but this device holds only {fits} of its "
            "blocks at once (compiled registers/shared memory): launching it would deadlock"
        )
