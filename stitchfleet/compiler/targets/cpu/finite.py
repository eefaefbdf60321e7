"""The guard's NaN/Inf test inside the C function, folded into the stores of the outputs.

Input: a store of a computed floating-point output (buffer, rendered index and value), and
the C lines of the whole function body. Output: the store with its test (`sf_bad = sf_umax(sf_bad,
sf_key_*(...))` on the value as stored), and the body with `reduction(max:sf_bad)` added to every
`omp for` and `omp simd` loop whose body holds such a test. The function returns `NONFINITE` when
`sf_bad` reaches `SF_BAD_KEY`.

Why at the store: the clusters are bound by memory traffic, and a separate pass after the
parallel region re-read every output (cluster 4 of the demo, six 512 KB outputs: 195 -> 163
us without it). The test is an integer one on the stored bits, so it vectorises without
fast-math, unlike a float test, and `isfinite` would be folded to true under -ffast-math: a
float's key is its bits without the sign, at least SF_BAD_KEY (exponent all ones) exactly for
NaN and Inf, and the flag is the unsigned max of the keys across stores, simd lanes and
threads: two vector instructions per stored vector (and, max) where a per-element
`(u & exp) == exp` OR'ed into an int took four (and, compare, mask to 0/1, or; demo clusters
counted by scripts/kernel_instructions.py). Double and f16 bits map to SF_BAD_KEY or 0.
The value tested is the assignment's value, i.e. after conversion to the storage type (an
f32 value that overflows `_Float16` is caught). Outputs that are graph parameters passed
through are never stored by the C code, so they are never tested.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from stitchfleet.compiler.kernel import ir as k

NONFINITE = 2  # the C function's return code when a checked output holds NaN or Inf
FLAG = "sf_bad"
DECLARE = f"uint32_t {FLAG} = 0;"  # the flag: the largest key stored so far (0: nothing stored)
BAD = f"{FLAG} >= SF_BAD_KEY"  # C: a NaN or Inf was stored
_TESTED = {"float": "float", "double": "double", "_Float16": "float"}  # storage type -> key function's
HELPERS = """
typedef uint16_t sf_u16a __attribute__((may_alias));
typedef uint32_t sf_u32a __attribute__((may_alias));
typedef uint64_t sf_u64a __attribute__((may_alias));
#define SF_BAD_KEY 0x7f800000u
static inline uint32_t sf_umax(uint32_t a, uint32_t b) { return a > b ? a : b; }
static inline uint32_t sf_key_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x7fffffffu;
}
static inline uint32_t sf_key_double(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull ? SF_BAD_KEY : 0u;
}
"""
_LOOP_PRAGMA = re.compile(r"^\s*#pragma omp (for|simd)\b")
_CHECKED = re.compile(rf"^(\s*){FLAG} = sf_umax\({FLAG}, sf_key_\w+\(((\w+)\[.*\]) = (.*)\)\);$")
_KEY = {  # storage C type -> (unsigned type of the same width that may alias it, key of its bits `b[i]`)
    "float": ("sf_u32a", "b[i] & 0x7fffffffu"),
    "double": ("sf_u64a", "(b[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull ? SF_BAD_KEY : 0u"),
    "_Float16": ("sf_u16a", "(b[i] & 0x7c00u) == 0x7c00u ? SF_BAD_KEY : 0u"),
}


def checked(buffer: k.AnyBuffer, storage: str, target: str, value: str) -> str | None:
    """`sf_bad = sf_umax(sf_bad, key(target = value));` for a float output buffer; None for anything else."""
    if not (isinstance(buffer, k.Buffer) and buffer.role is k.Role.OUTPUT and storage in _TESTED):
        return None
    return f"{FLAG} = sf_umax({FLAG}, sf_key_{_TESTED[storage]}({target} = {value}));"


def _span(lines: Sequence[str], start: int) -> int:
    """The index past the loop statement that begins at `start` (a one-line loop, or to its closing brace)."""
    depth = 0
    for end in range(start, len(lines)):
        depth += lines[end].count("{") - lines[end].count("}")
        if depth <= 0:
            return end + 1
    raise ValueError(f"unbalanced braces in the loop at generated line {start}: {lines[start]!r}")


def unchecked(lines: Sequence[str], keep: Collection[str]) -> tuple[list[str], list[str]]:
    """The lines with the test taken out of stores to buffers not in `keep`, and the names of those buffers.

    Why: in a task of the plan's row-wise loops (a row reduction, then its short rows) the test in the
    store loops measured slower than a pass after the region (demo softmax: 200 vs 134 us, gcc 12): those
    outputs are tested by `pass_after` instead. Fused element-wise loops keep the test in the loop."""
    out: list[str] = []
    moved: dict[str, None] = {}
    for line in lines:
        m = _CHECKED.match(line)
        if m is None or m.group(3) in keep:
            out.append(line)
            continue
        moved[m.group(3)] = None
        out.append(f"{m.group(1)}{m.group(2)} = {m.group(4)};")
    return out, list(moved)


def pass_after(buffers: Sequence[tuple[str, str, int]], pad: str) -> list[str]:
    """A test of whole buffers (name, storage type, size) after the parallel region."""
    lines: list[str] = []
    for name, storage, size in buffers:
        bits, key = _KEY[storage]
        lines += [
            f"{pad}{{",
            f"{pad}    const {bits} *restrict b = (const {bits} *){name};",
            f"{pad}    #pragma omp simd reduction(max:{FLAG})",
            f"{pad}    for (int64_t i = 0; i < {size}L; ++i) {FLAG} = sf_umax({FLAG}, {key});",
            f"{pad}}}",
        ]
    return lines


def with_reductions(lines: Sequence[str]) -> list[str]:
    """`lines` with `reduction(max:sf_bad)` on each loop pragma whose loop sets the flag."""
    out = list(lines)
    for i, line in enumerate(lines):
        if not _LOOP_PRAGMA.match(line) or "reduction(" in line or i + 1 >= len(lines):
            continue
        body = lines[i + 1 : _span(lines, i + 1)]
        if any(f"{FLAG} = sf_umax(" in b for b in body):
            out[i] = f"{line} reduction(max:{FLAG})"
    return out
