"""The acceptance rule: compiled within k x the native fp32 error of the fp64 reference."""

from __future__ import annotations

import numpy as np

from stitchfleet.compiler.tolerance import check, check_outputs, roundoff


def _case(n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    ref = np.random.default_rng(1).standard_normal(n)
    return ref, ref.astype(np.float32)


def test_same_rounding_passes_and_figures_are_reported() -> None:
    ref, native = _case()
    verdict = check(native, native, ref)
    assert verdict.ok
    assert verdict.reason == ""
    assert 0 < verdict.native_error <= 2 * roundoff(np.dtype(np.float32))
    assert verdict.allowed == 8.0 * max(verdict.native_error, roundoff(np.dtype(np.float32)))


def test_a_few_ulps_pass_a_real_error_fails() -> None:
    ref, native = _case()
    near = (native * np.float32(1 + 4e-7)).astype(np.float32)
    assert check(near, native, ref).ok
    wrong = native.copy()
    wrong[17] += np.float32(1e-3)
    verdict = check(wrong, native, ref)
    assert not verdict.ok
    assert "exceeds 8 x native error" in verdict.reason
    assert verdict.compiled_error > verdict.allowed


def test_factor_is_honoured() -> None:
    ref, native = _case()
    off = (native * np.float32(1 + 2e-6)).astype(np.float32)
    assert not check(off, native, ref, factor=2.0).ok
    assert check(off, native, ref, factor=100.0).ok


def test_near_zero_elements_use_the_absolute_floor() -> None:
    ref, native = _case()
    ref[3], native[3] = 1e-30, np.float32(0.0)
    compiled = native.copy()
    compiled[3] = np.float32(1e-10)  # huge relative error, harmless next to values of size ~1
    assert check(compiled, native, ref).ok


def test_non_finite_where_reference_is_finite_fails() -> None:
    ref, native = _case()
    compiled = native.copy()
    compiled[5] = np.nan
    verdict = check(compiled, native, ref)
    assert not verdict.ok
    assert "non-finite" in verdict.reason
    ref[6] = np.inf
    native[6] = np.inf
    compiled = native.copy()
    assert check(compiled, native, ref).ok


def test_integer_outputs_must_match_exactly_and_shapes_must_agree() -> None:
    native = np.arange(10, dtype=np.int32)
    assert check(native.copy(), native, native).ok
    off = native.copy()
    off[2] = 7
    assert "1 element(s) differ" in check(off, native, native).reason
    assert "shape" in check(native[:5], native, native).reason


def test_check_outputs_flags_missing_outputs() -> None:
    ref, native = _case(10)
    verdicts = check_outputs({"a": native}, {"a": native, "b": native}, {"a": ref, "b": ref})
    assert verdicts["a"].ok
    assert not verdicts["b"].ok
    assert "missing" in verdicts["b"].reason


def test_f16_uses_its_own_roundoff() -> None:
    ref = np.linspace(0.5, 2.0, 100)
    native = ref.astype(np.float16)
    assert check(native, native, ref).allowed >= 8 * roundoff(np.dtype(np.float16))
    assert roundoff(np.dtype(np.float32), bf16=True) == 2.0**-8
