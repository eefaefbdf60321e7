"""The numeric acceptance rule every backend test and the runtime guard use.

Input: a compiled result, the native unfused result and the float64 reference of the
same output, and optionally a way to re-evaluate that reference on perturbed inputs.
Output: a `OutputCheck`. The rule (DESIGN.md §2): the compiled result may be at most
`factor` times further from the fp64 reference than the unfused native result is.
Distance is the worst element's error scaled by |reference| + floor, where the floor
(`floor_ratio` times the reference's RMS) keeps near-zero elements from turning
harmless absolute differences into huge relative ones. The native error is never
taken below one unit roundoff of the output dtype, so a native result that happens to
be exact does not forbid a different rounding order. Where the reference is finite the
compiled result must be finite; integer and bool outputs must equal the native ones.

Backward-stability allowance (a second look, only for a floating output that misses the
rule, and only when the caller passes `perturbed`): the native result is one float32
rounding order among many, and on an ill-conditioned element (a sum whose terms cancel
10,000-fold, as in a batch-norm gradient's scale_backprop) that one order can happen to
be nearly exact, so 8 x its error forbids orders that are just as correct. The allowance
estimates the same thing the rule measures, the size of float32 rounding, robustly per
element: how far the fp64 reference itself moves when the inputs get relative noise of one
unit roundoff of their dtype (`evaluate(..., noise=draw)`), the largest movement over
`DRAWS` seeded draws. An element also passes when its error is within `factor` times that
movement, and never beyond `SENSITIVITY_CAP`. Per element, never a global loosening: a
dropped term, a wrong index or a bias changes an element by the size of its terms, orders
beyond its sensitivity, and the well-conditioned elements keep the rule as it was. The
output_check says when the allowance decided (`widened`, `reason`). This is the same DESIGN rule
(at most k times further from fp64 than the unfused fp32 result), with the fp32 rounding
estimated from the reference's sensitivity where one native result is a poor sample of it.
The two caps (`SENSITIVITY_CAP`, and `LINEAR_CAP` where the movement is shown linear in the noise)
and the case that needed the second: docs/tolerance.md.

A float64 output (`narrow`): its fp64 reference is no more precise than the output, only one more
float64 rounding order, so the native result's distance from it says nothing of the native result's
rounding (TF's column sum and numpy's are the same order: distance 0, and 8 x one roundoff forbade
every other order). The reference's own rounding is then estimated from the same computation a
precision lower: the float32 evaluation's error times u64 / u32 (rounding errors are linear in the
unit roundoff to first order), and the native error is taken at least that (`rounding_at`).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]

_ROUNDOFF = {np.dtype(np.float16): 2.0**-11, np.dtype(np.float32): 2.0**-24, np.dtype(np.float64): 2.0**-53}
BF16_ROUNDOFF = 2.0**-8
# Noise draws per second look. One draw's movement of one element is random and may be near zero by
# chance (the noise terms can cancel there too); the largest of a few is near the top of its spread
# (measured on NASNetMobile's cancelling element: median of 20 draws 1.7e-7, max 6.7e-7). A few, not
# many: each costs one more float64 evaluation of the cluster, and `factor` covers the rest.
DRAWS = 4
# The allowance never exceeds this scaled error (0.1% of |reference| + floor), the guard's cap on its
# summation allowance too: input noise that flips a comparison can move an element by O(1), which is
# not rounding to accept blindly, and a fault of 1% stays ten times above it. It also lets an output
# that is off by more be refused without paying for the draws.
SENSITIVITY_CAP = 1e-3
# An element whose movement is linear in the noise (its twin draw, the same direction at LINEAR_SCALE of
# the amplitude, moves it LINEAR_SCALE as far, within LINEAR_SLACK of that) is ill-conditioned, not
# discontinuous: its allowance may go up to LINEAR_CAP. A flip moves the twin as far as the draw (the
# flip persists) or not at all; smooth second-order terms at cond x u ~ 1e-3 are ~1e-6 of the movement.
# Transformer block cluster 8 (Adam's v = 0.999 v + 0.001 g^2 cancelling 2900-fold) needs 2.45e-3 on
# sim, with plain float32 column sums in other row orders at 2.9e-3 median (docs/tolerance.md).
LINEAR_CAP = 1e-2
LINEAR_SCALE = 0.25
LINEAR_SLACK = 0.2

# draw number -> the fp64 reference of one output on inputs perturbed by that draw
Perturbed = Callable[[int], object]


@dataclass(frozen=True)
class OutputCheck:
    """Whether one output passes, with the figures the guard reports. `allowed` is the scaled error
    the output may have; where the backward-stability allowance decided, elements have allowances of
    their own, and `allowed` is then compiled_error over the largest share of its own allowance any
    element uses (so compiled_error / allowed stays that share). `widened`: how many elements passed
    by that allowance only (0: the rule alone decided)."""

    ok: bool
    compiled_error: float
    native_error: float
    allowed: float
    reason: str = ""
    widened: int = 0


# Largest output (elements) whose float64 working arrays are kept between checks (two of them: 16 MiB at most).
# A check step judges hundreds of outputs: fresh temporaries of a few MiB each went back to the OS on free and
# were page-faulted in again on the next output, which cost several times the arithmetic.
SCRATCH_ELEMENTS = 1 << 20
_SCRATCH = threading.local()


def scratch(shape: tuple[int, ...]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Two float64 working arrays of `shape`, C-contiguous, kept per thread between calls up to
    SCRATCH_ELEMENTS (their contents are left over from the last use)."""
    size = math.prod(shape)
    if size > SCRATCH_ELEMENTS:
        return np.empty(shape), np.empty(shape)
    held: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = getattr(_SCRATCH, "buffers", None)
    if held is None or held[0].size < size:
        held = (np.empty(max(size, 1 << 16)), np.empty(max(size, 1 << 16)))
        _SCRATCH.buffers = held
    return held[0][:size].reshape(shape), held[1][:size].reshape(shape)


def roundoff(dtype: np.dtype[np.generic], bf16: bool = False) -> float:
    """Unit roundoff of a float dtype (bf16 values are held in float32: say so with bf16=True)."""
    return BF16_ROUNDOFF if bf16 else _ROUNDOFF.get(np.dtype(dtype), 2.0**-24)


def scaled_error(values: Array, reference: npt.NDArray[np.float64], floor: float) -> float:
    """max |values - reference| / (|reference| + floor) over the elements where the reference is finite."""
    finite = np.isfinite(reference)
    if finite.all():  # the usual output: no boolean-indexed copies (a check step judges ~300 outputs at once)
        diff = np.abs(np.subtract(values, reference, dtype=np.float64))  # float32 widens exactly, as by astype
        return float(np.max(diff / (np.abs(reference) + floor), initial=0.0))
    if not finite.any():
        return 0.0
    diff = np.abs(values.astype(np.float64)[finite] - reference[finite])
    return float(np.max(diff / (np.abs(reference[finite]) + floor), initial=0.0))


def error_floor(reference: npt.NDArray[np.float64], floor_ratio: float, native: Array | None = None) -> float:
    """`floor_ratio` times the RMS of the finite elements, and at least the RMS of the `native` result's own
    distance from them (never below the smallest float64).

    Why the second: an output whose every element cancels to about zero (the gradient of a centering summed over
    the axis it centers, `sum(dy - mean(dy))`: zero in exact arithmetic) has a reference of float64 rounding
    noise, so 0.1% of its RMS scaled TF's float32 noise (1e-9) into errors of 1e10 and the rule compared two
    draws of noise: a correct LayerNorm gradient cluster was reverted. Where the native result's rounding is
    larger than the floor, the output is that rounding, and errors are measured in its size."""
    finite = np.isfinite(reference)
    every = bool(finite.all())
    # ravel: the elements in the order boolean indexing gives them (C order), so the mean sums as it did
    values = reference.ravel() if every else reference[finite]
    rms = float(np.sqrt(np.mean(np.square(values)))) if values.size else 0.0
    floor = floor_ratio * rms
    if native is not None and native.shape == reference.shape and values.size:
        own = np.asarray(native).ravel() if every else np.asarray(native)[finite]
        deviation = np.subtract(own, values, dtype=np.float64)
        finite_deviation = np.isfinite(deviation)
        if not finite_deviation.all():
            deviation = deviation[finite_deviation]
        if deviation.size:
            floor = max(floor, float(np.sqrt(np.mean(np.square(deviation)))))
    return max(floor, float(np.finfo(np.float64).tiny))


def widened_difference(values: Array, reference: npt.NDArray[np.float64], out: npt.NDArray[np.float64]) -> Array:
    """values - reference in float64, into `out` (widened there first: a cast inside the subtraction was slower)."""
    np.copyto(out, values)
    return np.subtract(out, reference, out=out)


def rms_floor(squares: float, size: int, floor_ratio: float, deviation: float = 0.0) -> float:
    """`error_floor` from sums: `floor_ratio` x the RMS of `size` values whose squares sum to `squares`, at least
    the RMS of a deviation whose squares sum to `deviation`, never below the smallest float64."""
    return max(floor_ratio * math.sqrt(squares / size), math.sqrt(deviation / size), float(np.finfo(np.float64).tiny))


def largest_ratio(difference: npt.NDArray[np.float64], scale: npt.NDArray[np.float64]) -> float:
    """max |difference| / scale over every element (both float64, difference overwritten; scale > 0): the largest
    quotient and minus the smallest, two reads instead of an absolute value written back and read."""
    np.divide(difference, scale, out=difference)
    return max(float(difference.max()), -float(difference.min()))


def _rule_figures(
    got: Array, base: Array, ref: npt.NDArray[np.float64], floor_ratio: float
) -> tuple[float, ...] | None:
    """(floor, compiled error, native error) as `error_floor` and `scaled_error` give them, in a few passes over
    scratch arrays, for the usual output: reference and native result finite, sums of squares that do not
    overflow, a finite compiled error. None otherwise: the general path decides (non-finite values, empty).
    The sums of squares are dot products here (another summation order than np.mean's: float64 rounding)."""
    size = ref.size
    if size == 0:
        return None
    d, s = scratch(ref.shape)
    flat_d, flat_s = d.reshape(-1), s.reshape(-1)
    widened_difference(base, ref, d)
    # finite exactly when every deviation is (a non-finite reference or native element makes one non-finite)
    deviation = float(np.dot(flat_d, flat_d))
    np.abs(ref, out=s)
    squares = float(np.dot(flat_s, flat_s))
    if not (math.isfinite(deviation) and math.isfinite(squares)):
        return None
    floor = rms_floor(squares, size, floor_ratio, deviation)
    s += floor  # |reference| + floor, shared by both errors
    native_error = largest_ratio(d, s)
    compiled_error = largest_ratio(widened_difference(got, ref, d), s)
    # a non-finite compiled element (or an overflowing ratio) makes it non-finite: the general path says which
    return (floor, compiled_error, native_error) if math.isfinite(compiled_error) else None


def rounding_at(
    dtype: np.dtype[np.generic], computed: Array, reference: npt.NDArray[np.float64], floor: float
) -> float:
    """The scaled error the same computation makes when every op and every sum rounds at `dtype`'s roundoff,
    estimated from `computed` (that computation at another precision, `reference` being more precise than
    it): its scaled error times the ratio of the roundoffs (rounding errors are linear in the unit roundoff
    to first order). Elements where `computed` is not finite (a float32 overflow) give no estimate."""
    usable = np.isfinite(computed.astype(np.float64))
    if computed.shape != reference.shape or not usable.any():
        return 0.0
    error = scaled_error(computed[usable], reference[usable], floor)
    return error * roundoff(np.dtype(dtype)) / roundoff(computed.dtype)


def _exact(compiled: Array, native: Array) -> OutputCheck:
    mismatches = int(np.count_nonzero(compiled != native))
    reason = f"{mismatches} element(s) differ from the native result" if mismatches else ""
    return OutputCheck(mismatches == 0, float(mismatches), 0.0, 0.0, reason)


def check(
    compiled: object,
    native: object,
    reference: object,
    *,
    factor: float = 8.0,
    floor_ratio: float = 1e-3,
    bf16: bool = False,
    perturbed: Perturbed | None = None,
    narrow: object | None = None,
) -> OutputCheck:
    """Judges one output; see the module docstring for the rule, `perturbed` and `narrow` (the output
    computed in float32 on the same inputs, read only for a float64 output)."""
    got, base, ref = np.asarray(compiled), np.asarray(native), np.asarray(reference, dtype=np.float64)
    if got.shape != ref.shape or base.shape != ref.shape:
        return OutputCheck(False, float("inf"), 0.0, 0.0, f"shape {got.shape} differs from the reference {ref.shape}")
    if not np.issubdtype(base.dtype, np.floating):
        return _exact(got, base)
    with np.errstate(all="ignore"):  # inf and nan are data: the general path below judges them
        figures = _rule_figures(got, base, ref, floor_ratio)
    if figures is None:
        bad = np.isfinite(ref) & ~np.isfinite(got)  # (a float32 value is finite exactly when its widening is)
        if bad.any():
            count = int(np.count_nonzero(bad))
            return OutputCheck(
                False, float("inf"), 0.0, 0.0, f"{count} non-finite value(s) where the fp64 reference is finite"
            )
        floor = error_floor(ref, floor_ratio, base)
        compiled_error = scaled_error(got, ref, floor)
        native_error = scaled_error(base, ref, floor)
    else:
        floor, compiled_error, native_error = figures
    if narrow is not None and base.dtype == np.float64:
        native_error = max(native_error, rounding_at(base.dtype, np.asarray(narrow), ref, floor))
    allowed = factor * max(native_error, roundoff(base.dtype, bf16))
    ok = compiled_error <= allowed
    reason = "" if ok else f"error {compiled_error:.3g} exceeds {factor:g} x native error ({allowed:.3g} allowed)"
    output_check = OutputCheck(ok, compiled_error, native_error, allowed, reason)
    if ok or perturbed is None:
        return output_check
    if compiled_error > LINEAR_CAP:
        return OutputCheck(
            False,
            compiled_error,
            native_error,
            allowed,
            f"{reason}; beyond {LINEAR_CAP:g}, the cap of the backward-stability allowance",
        )
    return _second_look(output_check, got, ref, floor=floor, factor=factor, perturbed=perturbed)


def noise_of(draw: int) -> tuple[int, float]:
    """A draw number's noise: (direction, amplitude in units of roundoff). Draws 0 to DRAWS - 1 are one
    unit roundoff each in a random direction of their own; draw DRAWS + k is draw k's linearity twin, the
    same direction at LINEAR_SCALE of the amplitude (what `evaluate(..., noise=draw)` applies)."""
    if not 0 <= draw < 2 * DRAWS:
        raise ValueError(f"draw {draw} is not one of the {2 * DRAWS} draws")
    return (draw, 1.0) if draw < DRAWS else (draw - DRAWS, LINEAR_SCALE)


def _movements(reference: npt.NDArray[np.float64], perturbed: Perturbed, draws: range) -> npt.NDArray[np.float64]:
    """|perturbed reference - reference| per draw (stacked on a first axis). A draw that is non-finite
    where the reference is finite (an overflow at the edge) moves nothing there, so grants nothing."""
    moved = []
    for draw in draws:
        value = np.asarray(perturbed(draw), dtype=np.float64)
        if value.shape != reference.shape:
            raise ValueError(f"perturbed reference of shape {value.shape}, the reference's is {reference.shape}")
        with np.errstate(invalid="ignore"):
            step = np.abs(value - reference)
        moved.append(np.where(np.isfinite(step), step, 0.0))
    return np.stack(moved)


def sensitivity(reference: npt.NDArray[np.float64], perturbed: Perturbed) -> npt.NDArray[np.float64]:
    """Per element, the largest |perturbed reference - reference| over the `DRAWS` draws."""
    largest: npt.NDArray[np.float64] = _movements(reference, perturbed, range(DRAWS)).max(axis=0)
    return largest


def _linear(moves: npt.NDArray[np.float64], twins: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Per element, the largest movement of a draw whose twin moved LINEAR_SCALE as far (within LINEAR_SLACK)."""
    expected = LINEAR_SCALE * moves
    linear = np.abs(twins - expected) <= LINEAR_SLACK * expected
    largest: npt.NDArray[np.float64] = np.where(linear, moves, 0.0).max(axis=0)
    return largest


def _second_look(
    output_check: OutputCheck,
    got: Array,
    ref: npt.NDArray[np.float64],
    *,
    floor: float,
    factor: float,
    perturbed: Perturbed,
) -> OutputCheck:
    """The backward-stability allowance (module docstring) for an output that missed the rule."""
    finite = np.isfinite(ref)
    error = np.abs(got.astype(np.float64)[finite] - ref[finite])
    scale = np.abs(ref[finite]) + floor
    rule = output_check.allowed * scale
    moves = _movements(ref, perturbed, range(DRAWS))[:, finite]
    # each element's own limit: the rule's, or factor x the reference's movement (capped), whichever is larger
    limit = np.maximum(rule, np.minimum(factor * moves.max(axis=0), SENSITIVITY_CAP * scale))
    # the most any element could get, were its movement linear: the twins are paid only when that could help
    reach = np.maximum(rule, np.minimum(factor * moves.max(axis=0), LINEAR_CAP * scale))
    if np.all(error <= reach) and np.any(error > limit):
        twins = _movements(ref, perturbed, range(DRAWS, 2 * DRAWS))[:, finite]
        limit = np.maximum(limit, np.minimum(factor * _linear(moves, twins), LINEAR_CAP * scale))
    share = error / limit
    beyond = int(np.count_nonzero(error > rule))
    failing = int(np.count_nonzero(share > 1.0))
    if failing:
        why = (
            f"{failing} of {beyond} element(s) also beyond {factor:g} x the fp64 reference's movement under noise"
            f" (capped at {SENSITIVITY_CAP:g}, or {LINEAR_CAP:g} where the movement is linear in the noise)"
        )
        return OutputCheck(
            False,
            output_check.compiled_error,
            output_check.native_error,
            output_check.allowed,
            f"{output_check.reason}; {why}",
        )
    worst = float(np.max(share))
    reason = (
        f"{output_check.reason} on {beyond} element(s), each within {factor:g} x the fp64 reference's movement under"
        f" float32 input noise (backward-stability allowance, worst at {worst:.2g} of it)"
    )
    return OutputCheck(
        True,
        output_check.compiled_error,
        output_check.native_error,
        output_check.compiled_error / worst,
        reason,
        beyond,
    )


def check_outputs(
    compiled: Mapping[str, object],
    native: Mapping[str, object],
    reference: Mapping[str, object],
    *,
    factor: float = 8.0,
    bf16_outputs: frozenset[str] = frozenset(),
    perturbed: Callable[[int], Mapping[str, object]] | None = None,
) -> dict[str, OutputCheck]:
    """One output_check per output name of `native`; a missing compiled output fails. `perturbed`: draw number
    -> every output's fp64 reference on perturbed inputs (one evaluation per draw, shared by the outputs)."""
    draws = None if perturbed is None else functools.cache(perturbed)
    output_checks = {}
    for name in native:
        if name not in compiled:
            output_checks[name] = OutputCheck(False, float("inf"), 0.0, 0.0, f"output {name!r} is missing")
            continue
        own = None if draws is None else output_of(draws, name)
        bf16 = name in bf16_outputs
        output_checks[name] = check(
            compiled[name], native[name], reference[name], factor=factor, bf16=bf16, perturbed=own
        )
    return output_checks


def output_of(draws: Callable[[int], Mapping[str, object]], name: str) -> Perturbed:
    """One output's `Perturbed` out of a function giving every output's perturbed reference per draw."""
    return lambda draw: draws(draw)[name]
