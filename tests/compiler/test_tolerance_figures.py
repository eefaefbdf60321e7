"""tolerance.check's figures in few passes (scratch arrays, dot-product sums) against the rule written plainly.

The guard's check step judges hundreds of outputs, so `check` computes each output's shared pieces once
(issue 29); the findings must stay the rule's: the same ok and reason, the figures equal to within float64
rounding of the sums, on every kind of output the guard meets.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stitchfleet.compiler.tolerance import OutputCheck, check, roundoff, scratch

RNG = np.random.default_rng(29)


def plain_rule(compiled: np.ndarray, native: np.ndarray, reference: np.ndarray, floor_ratio: float) -> OutputCheck:
    """The rule as the module docstring states it, with boolean masks and np.mean (factor 8, no allowance)."""
    got, base, ref = np.asarray(compiled), np.asarray(native), np.asarray(reference, dtype=np.float64)
    if got.shape != ref.shape or base.shape != ref.shape:
        return OutputCheck(False, math.inf, 0.0, 0.0, f"shape {got.shape} differs from the reference {ref.shape}")
    if not np.issubdtype(base.dtype, np.floating):
        wrong = int(np.count_nonzero(got != base))
        return OutputCheck(
            wrong == 0, float(wrong), 0.0, 0.0, f"{wrong} element(s) differ from the native result" if wrong else ""
        )
    finite = np.isfinite(ref)
    bad = int(np.count_nonzero(finite & ~np.isfinite(got)))
    if bad:
        return OutputCheck(False, math.inf, 0.0, 0.0, f"{bad} non-finite value(s) where the fp64 reference is finite")
    values = ref[finite]
    floor = floor_ratio * float(np.sqrt(np.mean(np.square(values)))) if values.size else 0.0
    deviation = base.astype(np.float64)[finite] - values
    deviation = deviation[np.isfinite(deviation)]
    if deviation.size:
        floor = max(floor, float(np.sqrt(np.mean(np.square(deviation)))))
    floor = max(floor, float(np.finfo(np.float64).tiny))

    def scaled(x: np.ndarray) -> float:
        diff = np.abs(x.astype(np.float64)[finite] - values)
        return float(np.max(diff / (np.abs(values) + floor), initial=0.0))

    compiled_error, native_error = scaled(got), scaled(base)
    allowed = 8.0 * max(native_error, roundoff(base.dtype))
    ok = compiled_error <= allowed
    reason = "" if ok else f"error {compiled_error:.3g} exceeds 8 x native error ({allowed:.3g} allowed)"
    return OutputCheck(ok, compiled_error, native_error, allowed, reason)


def same(a: float, b: float) -> bool:
    """Equal, both nan, or equal to within float64 rounding of sums (1e-12 relative)."""
    return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-12 * max(abs(a), abs(b))


def cases() -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(what, compiled, native, reference): every kind of output a check step meets."""
    out = []
    for k in range(40):
        shape = tuple(int(d) for d in RNG.integers(1, 40, int(RNG.integers(0, 4))))
        ref = RNG.standard_normal(shape) * 10.0 ** float(RNG.integers(-6, 6))
        native = (ref * (1 + 6e-8 * RNG.standard_normal(shape))).astype(np.float32)
        compiled = (ref * (1 + 6e-8 * RNG.standard_normal(shape) * (1 + 30 * (k % 3 == 0)))).astype(np.float32)
        out.append(("float32", compiled, native, ref))
        if ref.ndim == 2:
            out.append(("transposed views", compiled.T, native.T, ref.T))
    ref = RNG.standard_normal(4096)
    native = ref.astype(np.float32)
    out.append(("zero output", np.zeros(4096, np.float32), np.zeros(4096, np.float32), np.zeros(4096)))
    out.append(("zero compiled", np.zeros(4096, np.float32), native, ref))
    out.append(("empty", np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0)))
    # the error_floor docstring's case: a reference of float64 rounding noise, TF's result of float32 noise
    noise = RNG.standard_normal(4096) * 1e-17
    out.append(
        (
            "cancellation",
            (RNG.standard_normal(4096) * 1e-9).astype(np.float32),
            (RNG.standard_normal(4096) * 1e-9).astype(np.float32),
            noise,
        )
    )
    for where, value in (
        ("reference", np.inf),
        ("reference", np.nan),
        ("native", np.nan),
        ("native", np.inf),
        ("compiled", np.nan),
        ("compiled", -np.inf),
    ):
        r, n, c = ref.copy(), native.copy(), (ref * (1 + 1e-7)).astype(np.float32)
        {"reference": r, "native": n, "compiled": c}[where][[7, 900]] = value
        out.append((f"{value} in the {where}", c, n, r))
    both = ref.copy()
    both[3] = np.inf
    c, n = (both * (1 + 1e-7)).astype(np.float32), both.astype(np.float32)
    out.append(("inf where the reference is inf", c, n, both))
    huge = RNG.standard_normal(64) * 1e200  # sums of squares overflow: the general path
    out.append(("overflowing squares", huge * (1 + 1e-15), huge * (1 - 1e-15), huge))
    tiny = np.full(64, 0.0)
    out.append(("ratio overflow", np.full(64, 3e38, np.float32), np.zeros(64, np.float32), tiny))
    ints = RNG.integers(-9, 9, (17, 5)).astype(np.int32)
    wrong = ints.copy()
    wrong[2, 3] += 1
    out.append(("integer equal", ints.copy(), ints, ints.astype(np.float64)))
    out.append(("integer differing", wrong, ints, ints.astype(np.float64)))
    flags = RNG.random(33) < 0.5
    out.append(("bool", flags.copy(), flags, flags.astype(np.float64)))
    r64 = RNG.standard_normal((31, 7))
    out.append(("float64", r64 * (1 + 2e-16 * RNG.standard_normal(r64.shape)), r64 * (1 + 1e-16), r64))
    out.append(("float16", ref.astype(np.float16) * np.float16(1.001), ref.astype(np.float16), ref))
    out.append(("0-d", np.float32(1.5), np.float32(1.5000001), np.float64(1.5000000001)))
    out.append(("other shape", np.zeros(5, np.float32), np.zeros(4, np.float32), np.zeros(4)))
    return out


@pytest.mark.parametrize("floor_ratio", [1e-3, 1e-2])
def test_check_finds_what_the_plain_rule_finds(floor_ratio: float) -> None:
    for what, compiled, native, reference in cases():
        with np.errstate(all="ignore"):  # overflowing squares and ratios are cases here
            expected = plain_rule(np.asarray(compiled), np.asarray(native), np.asarray(reference), floor_ratio)
            found = check(compiled, native, reference, floor_ratio=floor_ratio)
        assert (found.ok, found.reason) == (expected.ok, expected.reason), what
        for field in ("compiled_error", "native_error", "allowed"):
            assert same(getattr(found, field), getattr(expected, field)), (what, field, found, expected)


def test_a_miss_is_found_where_it_lies_whatever_the_scratch_arrays_held() -> None:
    """The scratch arrays are shared between checks: a check after a larger one reads only its own elements."""
    big = RNG.standard_normal(100_000)
    assert check(big.astype(np.float32), big.astype(np.float32), big).ok
    small = RNG.standard_normal(300)
    faulty = small.astype(np.float32)
    faulty[-1] *= 1.01
    found = check(faulty, small.astype(np.float32), small)
    assert not found.ok and found.compiled_error > 1e-3


def test_scratch_arrays_are_kept_up_to_their_cap_and_fresh_beyond() -> None:
    first, _ = scratch((10, 10))
    again, _ = scratch((5, 4))
    assert np.shares_memory(first, again)  # kept between calls: no fresh pages per output
    assert first.shape == (10, 10) and again.shape == (5, 4) and again.flags.c_contiguous
