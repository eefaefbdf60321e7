"""The numeric acceptance rule every backend test and the runtime guard use.

Input: a compiled result, the native unfused result and the float64 reference of the
same output. Output: a `Verdict`. The rule (DESIGN.md §2): the compiled result may be
at most `factor` times further from the fp64 reference than the unfused native result
is. Distance is the worst element's error scaled by |reference| + floor, where the
floor (`floor_ratio` times the reference's RMS) keeps near-zero elements from turning
harmless absolute differences into huge relative ones. The native error is never
taken below one unit roundoff of the output dtype, so a native result that happens to
be exact does not forbid a different rounding order. Where the reference is finite the
compiled result must be finite; integer and bool outputs must equal the native ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]

_ROUNDOFF = {np.dtype(np.float16): 2.0**-11, np.dtype(np.float32): 2.0**-24, np.dtype(np.float64): 2.0**-53}
BF16_ROUNDOFF = 2.0**-8


@dataclass(frozen=True)
class Verdict:
    """Whether one output passes, with the figures the guard reports."""

    ok: bool
    compiled_error: float
    native_error: float
    allowed: float
    reason: str = ""


def roundoff(dtype: np.dtype[np.generic], bf16: bool = False) -> float:
    """Unit roundoff of a float dtype (bf16 values are held in float32: say so with bf16=True)."""
    return BF16_ROUNDOFF if bf16 else _ROUNDOFF.get(np.dtype(dtype), 2.0**-24)


def scaled_error(values: Array, reference: npt.NDArray[np.float64], floor: float) -> float:
    """max |values - reference| / (|reference| + floor) over the elements where the reference is finite."""
    finite = np.isfinite(reference)
    if not finite.any():
        return 0.0
    diff = np.abs(values.astype(np.float64)[finite] - reference[finite])
    return float(np.max(diff / (np.abs(reference[finite]) + floor), initial=0.0))


def error_floor(reference: npt.NDArray[np.float64], floor_ratio: float) -> float:
    """`floor_ratio` times the RMS of the finite elements (never below the smallest float64)."""
    finite = reference[np.isfinite(reference)]
    rms = float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0
    return max(floor_ratio * rms, float(np.finfo(np.float64).tiny))


def _exact(compiled: Array, native: Array) -> Verdict:
    mismatches = int(np.count_nonzero(compiled != native))
    reason = f"{mismatches} element(s) differ from the native result" if mismatches else ""
    return Verdict(mismatches == 0, float(mismatches), 0.0, 0.0, reason)


def check(
    compiled: object,
    native: object,
    reference: object,
    *,
    factor: float = 8.0,
    floor_ratio: float = 1e-3,
    bf16: bool = False,
) -> Verdict:
    """Judges one output; see the module docstring for the rule."""
    got, base, ref = np.asarray(compiled), np.asarray(native), np.asarray(reference, dtype=np.float64)
    if got.shape != ref.shape or base.shape != ref.shape:
        return Verdict(False, float("inf"), 0.0, 0.0, f"shape {got.shape} differs from the reference {ref.shape}")
    if not np.issubdtype(base.dtype, np.floating):
        return _exact(got, base)
    bad = np.isfinite(ref) & ~np.isfinite(got.astype(np.float64))
    if bad.any():
        count = int(np.count_nonzero(bad))
        return Verdict(False, float("inf"), 0.0, 0.0, f"{count} non-finite value(s) where the fp64 reference is finite")
    floor = error_floor(ref, floor_ratio)
    compiled_error = scaled_error(got, ref, floor)
    native_error = scaled_error(base, ref, floor)
    allowed = factor * max(native_error, roundoff(base.dtype, bf16))
    ok = compiled_error <= allowed
    reason = "" if ok else f"error {compiled_error:.3g} exceeds {factor:g} x native error ({allowed:.3g} allowed)"
    return Verdict(ok, compiled_error, native_error, allowed, reason)


def check_outputs(
    compiled: Mapping[str, object],
    native: Mapping[str, object],
    reference: Mapping[str, object],
    *,
    factor: float = 8.0,
    bf16_outputs: frozenset[str] = frozenset(),
) -> dict[str, Verdict]:
    """One verdict per output name of `native`; a missing compiled output fails."""
    verdicts = {}
    for name in native:
        if name not in compiled:
            verdicts[name] = Verdict(False, float("inf"), 0.0, 0.0, f"output {name!r} is missing")
            continue
        verdicts[name] = check(compiled[name], native[name], reference[name], factor=factor, bf16=name in bf16_outputs)
    return verdicts
