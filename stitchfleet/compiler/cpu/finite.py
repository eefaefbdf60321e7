"""The guard's NaN/Inf test inside the C function: one int out instead of numpy over every output.

Input: the computed floating-point output buffers of a cluster (name, storage dtype, size).
Output: C lines, placed after the parallel region, that set `sf_bad` when any element of
those outputs is NaN or +-Inf; the function then returns `NONFINITE`.

Why in C: the bridge used to run `np.isfinite(v).all()` per output after each call (an
allocated bool array and a second Python pass, 3-70 us per cluster). Here the test reads the
outputs right after they were written (still in cache) as integers: exponent bits all ones
means NaN or Inf. An integer OR-reduction vectorises without fast-math, unlike a float one,
and `isfinite` would be folded to true under -ffast-math. Outputs that are graph parameters
passed through are not written by the C code, so they are not read here.
"""

from __future__ import annotations

from collections.abc import Sequence

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import ir as k

NONFINITE = 2  # the C function's return code when a checked output holds NaN or Inf
_BITS = {  # storage C type -> (unsigned type of the same width, exponent mask)
    "float": ("sf_u32a", "0x7f800000u"),
    "double": ("sf_u64a", "0x7ff0000000000000ull"),
    "_Float16": ("sf_u16a", "0x7c00u"),
}
TYPEDEFS = """
typedef uint16_t sf_u16a __attribute__((may_alias));
typedef uint32_t sf_u32a __attribute__((may_alias));
typedef uint64_t sf_u64a __attribute__((may_alias));
"""


def finite_check(buffers: Sequence[k.Buffer], storage: dict[DType, str], pad: str) -> list[str]:
    """`int sf_bad` = 1 when an element of a float buffer has an all-ones exponent."""
    lines = [f"{pad}int sf_bad = 0;"]
    for buf in buffers:
        if not buf.dtype.is_float:
            continue
        bits, mask = _BITS[storage[buf.dtype]]
        lines += [
            f"{pad}{{",
            f"{pad}    const {bits} *restrict b = (const {bits} *){buf.name};",
            f"{pad}    #pragma omp simd reduction(|:sf_bad)",
            f"{pad}    for (int64_t i = 0; i < {buf.size}L; ++i) sf_bad |= (b[i] & {mask}) == {mask};",
            f"{pad}}}",
        ]
    return lines
