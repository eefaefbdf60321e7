"""What ptxas made of rendered kernels, and the gate on it: registers, spills, shared memory, occupancy.

Input: rendered kernels (`CudaKernel`: source, launch, dynamic shared memory), an nvcc, an arch and the
planner's device profile. Output: `ResourceUse` per kernel, parsed from `nvcc -cubin -Xptxas -v`
(ptxas's own report of the compiled code), and `GateRow` per kernel: its real occupancy (the devices
model fed those figures) against the blocks per SM its plan needs, and a grid-barrier kernel's grid
against the co-resident grid with `BARRIER_HEADROOM`. The rules and the table: docs in
benchmarks/README.md ("Kernel resources").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from stitchfleet.compiler.devices import Device, DeviceError, occupancy
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.plan.planner import BARRIER_HEADROOM  # what the planner leaves free: the gate checks it
from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.nvcc import Nvcc
from stitchfleet.compiler.targets.cuda.render import render_kernel, render_module
from stitchfleet.compiler.targets.cuda.signature import CudaKernel

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


@dataclass(frozen=True)
class ResourceUse:
    """One compiled kernel as ptxas reports it."""

    name: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    static_smem: int

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def parse_ptxas(report: str) -> dict[str, ResourceUse]:
    """Kernel name -> its resource use, from `-Xptxas -v` output (ValueError on a kernel it cannot read)."""
    found: dict[str, ResourceUse] = {}
    name, frame = "", (0, 0, 0)
    for line in report.splitlines():
        if entry := _ENTRY.search(line):
            name, frame = entry.group(1), (0, 0, 0)
        elif (props := _FRAME.search(line)) and name:
            frame = (int(props.group(1)), int(props.group(2)), int(props.group(3)))
        elif (used := _USED.search(line)) and name:
            stack, stores, loads = frame
            smem = int(used.group(2) or 0)
            found[name] = ResourceUse(name, int(used.group(1)), stores, loads, stack, smem)
            name = ""
    if name:
        raise ValueError(f"ptxas reported no register use for {name}")
    return found


def resource_use(
    kernels: Sequence[ir.Kernel], nvcc: Nvcc, arch: str, cache: ArtifactCache | None = None
) -> dict[str, ResourceUse]:
    """Every kernel compiled in one translation unit by `nvcc` for `arch`, as ptxas reports it."""
    used = parse_ptxas(nvcc.ptxas_report(render_module(list(kernels)), arch, cache))
    missing = sorted(k.name for k in kernels if k.name not in used)
    if missing:
        raise ValueError(f"ptxas reported nothing for {', '.join(missing[:5])}")
    return used


@dataclass(frozen=True)
class GateRow:
    """One kernel against the gate: what ptxas made of it and what its launch needs of the device."""

    name: str
    registers: int
    spills: int
    static_smem: int
    dynamic_smem: int
    block: int
    grid: int
    needed_per_sm: int  # blocks per SM the plan needs resident: ceil(grid / SMs), for a barrier with its headroom
    resident_per_sm: int  # blocks per SM the device keeps resident with the compiled figures
    barrier: bool
    coresident_grid: int  # resident_per_sm x SMs
    headroom: float  # share of the co-resident grid a grid-barrier launch leaves free (1.0 without one)

    @property
    def problems(self) -> list[str]:
        """Why the kernel fails the gate (empty: it passes)."""
        found = []
        if self.spills:
            found.append(f"{self.spills} bytes of spill stores and loads")
        if self.resident_per_sm < self.needed_per_sm:
            found.append(f"{self.resident_per_sm} block(s)/SM resident, the plan needs {self.needed_per_sm}")
        if self.barrier and self.headroom < BARRIER_HEADROOM:
            found.append(f"grid barrier with {self.grid} of {self.coresident_grid} co-resident blocks")
        return found

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "problems": self.problems}


def gate_row(kernel: CudaKernel, used: ResourceUse, dev: Device) -> GateRow:
    """The kernel's row: occupancy from the compiled figures on `dev`, against its launch."""
    launch = kernel.launch
    smem = used.static_smem + kernel.dynamic_smem_bytes
    try:
        resident = occupancy(dev, launch.block, max(used.registers, 1), smem).blocks_per_sm
    except DeviceError:
        resident = 0
    coresident = resident * dev.sms
    headroom = 1.0 if not kernel.grid_barrier else (1.0 - launch.grid / coresident if coresident else 0.0)
    return GateRow(
        kernel.name,
        used.registers,
        used.spills,
        used.static_smem,
        kernel.dynamic_smem_bytes,
        launch.block,
        launch.grid,
        math.ceil(launch.grid / (dev.sms * (1 - BARRIER_HEADROOM) if kernel.grid_barrier else dev.sms)),
        resident,
        kernel.grid_barrier,
        coresident,
        round(headroom, 4),
    )


def gate(
    kernels: Sequence[ir.Kernel], nvcc: Nvcc, arch: str, dev: Device, cache: ArtifactCache | None = None
) -> list[GateRow]:
    """Every kernel's gate row (one nvcc run for all of them)."""
    used = resource_use(kernels, nvcc, arch, cache)
    return [gate_row(render_kernel(k), used[k.name], dev) for k in kernels]
