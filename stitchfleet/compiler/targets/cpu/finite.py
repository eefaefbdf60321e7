"""The guard's NaN/Inf test inside the C function, folded into the stores of the outputs.

Input: a store of a computed floating-point output (buffer, rendered index and value), and
the C lines of the whole function body. Output: the store with its test (`sf_bad = sf_umax(sf_bad,
sf_key_*(...))` on the value as stored), the body with `reduction(max:sf_bad)` added to every
`omp for` and `omp simd` loop whose body holds such a test, and in a short simd loop the test on a
flag per column instead (`laned`). The function returns `NONFINITE` when `sf_bad` reaches `SF_BAD_KEY`.

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
_SIMD_PRAGMA = re.compile(r"^\s*#pragma omp simd\b")
# A simd loop over a constant range from 0, its body in braces: the loops the generator writes for a row's columns.
_LANE_LOOP = re.compile(r"^\s*for \(int64_t (\w+) = 0; \1 < (\d+)L; \+\+\1\) \{$")
LANES = "sf_lane"  # per-column flags of a part's short simd loops (`laned`)
# The longest simd loop whose stores keep per-column flags (4 KB of them: L1 holds them beside the rows).
LANES_MAX = 1024
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


def laned(lines: Sequence[str], keep: Collection[str], limit: int = LANES_MAX) -> tuple[list[str], list[str], int]:
    """The lines with the test of stores in simd loops of at most `limit` columns on a flag per column, the tests of
    other stores to buffers in `keep` as they are (reduced in their loop: `with_reductions`), the rest taken out;
    the buffers whose tests were taken out (for `pass_after`), and how many column flags the part declares.

    Why: in a short simd loop (a row's 32 columns) the test on `sf_bad` made gcc reduce the flag across the vector's
    lanes at the end of every row, which cost more than a pass after the region (demo softmax: 200 vs 134 us, gcc
    12), and that pass re-reads every output: the Transformer's q/k/v bias cluster, four 256 KB outputs over rows of
    32, ran 35 us with it, 25 us with the flags here, 24 us with no test at all (one thread, this machine's gcc).
    In a fused loop's long rows the flags beat the simd reduction too (bias + GELU at 512 x 512: 247 -> 231 us).
    `sf_lane[c] = sf_umax(sf_lane[c], key)` is an element-wise update of an array the loop indexes by its own
    variable: no dependence between iterations, nothing to reduce until the part ends (`lanes_reduced`). A store
    outside such a loop, or in a loop longer than `limit` (0: every store), is tested after the region as before."""
    out: list[str] = []
    moved: dict[str, None] = {}
    lanes, depth = 0, 0
    loops: list[tuple[str, int, int]] = []  # open simd loops: (variable, extent, the depth their braces close to)
    for i, line in enumerate(lines):
        loop = _LANE_LOOP.match(line) if i and _SIMD_PRAGMA.match(lines[i - 1]) else None
        if loop is not None:
            loops.append((loop.group(1), int(loop.group(2)), depth))
        m = _CHECKED.match(line)
        written = line
        inner = loops[-1] if loops else None
        if m is not None and inner is not None and inner[1] <= limit:
            column = inner[0]
            lanes = max(lanes, inner[1])
            key = line[len(m.group(1)) :].removeprefix(f"{FLAG} = sf_umax({FLAG}, ")
            written = f"{m.group(1)}{LANES}[{column}] = sf_umax({LANES}[{column}], {key}"
        elif m is not None and m.group(3) not in keep:
            moved[m.group(3)] = None
            written = f"{m.group(1)}{m.group(2)} = {m.group(4)};"
        out.append(written)
        depth += line.count("{") - line.count("}")
        while loops and depth <= loops[-1][2]:
            loops.pop()
    return out, list(moved), lanes


def lanes_declared(lanes: int, pad: str) -> list[str]:
    """A part's column flags (`laned`), all clear; nothing when it has none."""
    return [f"{pad}uint32_t {LANES}[{lanes}] = {{0}};"] if lanes else []


def lanes_reduced(lanes: int, pad: str) -> list[str]:
    """The column flags folded into `sf_bad` once, at the part's end."""
    if not lanes:
        return []
    return [f"{pad}for (int64_t sf_l = 0; sf_l < {lanes}L; ++sf_l) {FLAG} = sf_umax({FLAG}, {LANES}[sf_l]);"]


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
