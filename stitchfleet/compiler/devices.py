"""Device profiles and the occupancy model the stitch planner sizes its launches with.

Input: a device name ("h200", "v100", "tiny") and a launch's per-block resources
(threads, registers per thread, shared memory bytes). Output: a `Device` profile and
`Occupancy`: how many blocks of that launch are resident per SM and per wave (all SMs),
and which resource limits it. A kernel with a grid barrier must launch at most one
wave of blocks, or the blocks that are not resident wait forever for the barrier.

The `tiny` profile is not a real GPU: it makes waves small (4 blocks of 128 threads)
so tests reach the grid-barrier, vertical-packing and task-splitting paths at shapes
the sim backend runs in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

WARP = 32  # lanes of a warp: the one warp width of every device profile and target (kernel IR, plan, renderers)


class DeviceError(ValueError):
    """An unknown device name or a launch no SM of the device can hold."""


@dataclass(frozen=True)
class Device:
    """Per-device limits (CUDA occupancy calculator terms)."""

    name: str
    sms: int
    threads_per_sm: int
    threads_per_block: int
    blocks_per_sm: int
    registers_per_sm: int
    registers_per_thread: int
    smem_per_block: int
    smem_per_sm: int
    register_granularity: int = 256  # registers are allocated per warp in units of this many


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks for one launch shape, and the resource that caps them."""

    blocks_per_sm: int
    blocks_per_wave: int
    limited_by: str

    @property
    def reason(self) -> str:
        return f"{self.blocks_per_sm} block(s)/SM x SMs = {self.blocks_per_wave} per wave, limited by {self.limited_by}"


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("h200", 132, 2048, 1024, 32, 65536, 255, 227 * 1024, 228 * 1024),
        Device("v100", 80, 2048, 1024, 32, 65536, 255, 96 * 1024, 96 * 1024),
        Device("tiny", 2, 256, 128, 2, 16384, 255, 4 * 1024, 8 * 1024),
    )
}


def device(name: str) -> Device:
    """The profile named `name`; raises DeviceError listing the known ones."""
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise DeviceError(f"unknown device {name!r} (known: {', '.join(DEVICES)})") from None


def _registers_per_block(dev: Device, threads: int, registers: int) -> int:
    per_warp = -(-registers * WARP // dev.register_granularity) * dev.register_granularity
    return per_warp * -(-threads // WARP)


def occupancy(dev: Device, threads: int, registers: int = 32, smem: int = 0) -> Occupancy:
    """Blocks per SM and per wave for blocks of `threads` threads, `registers`/thread, `smem` bytes."""
    if threads <= 0 or threads % WARP or threads > dev.threads_per_block:
        raise DeviceError(
            f"{dev.name}: a block of {threads} threads is not a multiple of 32 up to {dev.threads_per_block}"
        )
    if registers > dev.registers_per_thread:
        raise DeviceError(f"{dev.name}: {registers} registers/thread exceeds the limit {dev.registers_per_thread}")
    if smem > dev.smem_per_block:
        raise DeviceError(f"{dev.name}: {smem} bytes of shared memory per block exceeds {dev.smem_per_block}")
    limits = {
        "threads per SM": dev.threads_per_sm // threads,
        "blocks per SM": dev.blocks_per_sm,
        "registers per SM": dev.registers_per_sm // _registers_per_block(dev, threads, registers),
        "shared memory per SM": dev.smem_per_sm // smem if smem else dev.blocks_per_sm,
    }
    limited_by = min(limits, key=lambda k: limits[k])
    per_sm = limits[limited_by]
    if per_sm == 0:
        raise DeviceError(f"{dev.name}: no SM can hold a block of {threads} threads ({limited_by})")
    return Occupancy(per_sm, per_sm * dev.sms, limited_by)


def relax_registers(dev: Device, threads: int, smem: int, assumed: int = 32, blocks_per_sm: int | None = None) -> int:
    """The largest register cap keeping `blocks_per_sm` blocks resident (default: the blocks per SM of the
    `assumed` cap, "assume, relax, apply"); never below `assumed`."""
    target = occupancy(dev, threads, assumed, smem).blocks_per_sm if blocks_per_sm is None else blocks_per_sm
    best = assumed
    for registers in range(assumed, dev.registers_per_thread + 1):
        resident = occupancy_or_none(dev, threads, registers, smem)
        if resident is None or resident < target:
            break
        best = registers
    return best


def occupancy_or_none(dev: Device, threads: int, registers: int, smem: int) -> int | None:
    """Blocks per SM, or None where the launch does not fit at all."""
    try:
        return occupancy(dev, threads, registers, smem).blocks_per_sm
    except DeviceError:
        return None
