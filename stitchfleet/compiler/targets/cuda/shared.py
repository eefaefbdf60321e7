"""Shared memory declarations of a rendered CUDA kernel: arrays, and arena views at byte offsets.

Input: a `Kernel` (its shared buffers and launch). Output: the declaration lines for the
kernel body and the dynamic shared bytes the launch must pass (0: all static). Static
`__shared__` arrays up to 48 KiB; arena views (buffers with a byte offset, which may
overlap: the planner's reuse by liveness) are typed pointers into one static byte
array. Beyond 48 KiB, or with dynamic bytes in the launch, one `extern __shared__`
array is carved into the arena (first) and the arrays (16-byte aligned each).
"""

from __future__ import annotations

from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.targets.cuda.expr import C_TYPE

STATIC_SHARED_LIMIT = 48 * 1024
ARENA = "sf_arena"


def _view_line(view: ir.SharedBuffer, base: str, offset: int) -> str:
    ctype = C_TYPE[view.dtype]
    return f"{ctype}* const {view.name} = reinterpret_cast<{ctype}*>({base} + {offset});"


def shared_lines(kernel: ir.Kernel) -> tuple[list[str], int]:
    """Shared declarations, and the dynamic shared bytes the launch must pass (0: all static).

    Arena views are typed pointers into one byte array (the arena first when carved
    from dynamic shared memory, then the arrays of their own, each 16-byte aligned).
    """
    views = [s for s in kernel.shared if s.offset is not None]
    arrays = [s for s in kernel.shared if s.offset is None]
    arena = kernel.arena_bytes
    static = sum(s.nbytes for s in arrays) + arena
    if static <= STATIC_SHARED_LIMIT and kernel.launch.dynamic_smem_bytes == 0:
        lines = [f"__shared__ __align__(16) unsigned char {ARENA}[{arena}];"] if views else []
        lines += [_view_line(v, ARENA, v.offset or 0) for v in views]
        return lines + [f"__shared__ __align__(16) {C_TYPE[s.dtype]} {s.name}[{s.size}];" for s in arrays], 0
    lines = ["extern __shared__ __align__(16) unsigned char sf_smem[];"]
    lines += [_view_line(v, "sf_smem", v.offset or 0) for v in views]
    offset = -(-arena // 16) * 16
    for s in arrays:
        lines.append(_view_line(s, "sf_smem", offset))
        offset += -(-s.nbytes // 16) * 16
    return lines, offset + kernel.launch.dynamic_smem_bytes
