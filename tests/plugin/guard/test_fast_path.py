"""The guard's fast path (judge without fp64 when the stitched outputs are within (factor - 1) / 2 roundoff of
TF's) decides from a strided sample first and then in a few passes over scratch arrays (issue 29): the same
Finding as the fast path written plainly, on outputs that pass, miss in a sampled element or only elsewhere,
hold non-finite values, integers or another shape."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stitchfleet.compiler.tolerance import error_floor, roundoff, scaled_error
from stitchfleet.plugin.guard import numeric
from stitchfleet.plugin.guard.numeric import Finding

RNG = np.random.default_rng(2929)


def plain_fast_path(outputs: list[str], stitched: list[Any], original: list[Any], factor: float) -> Finding | None:
    """Every output's whole distance from TF's result, element by element definitions (no sample)."""
    worst, name, allowed = 0.0, outputs[0], 0.0
    for output, given, tf_value in zip(outputs, stitched, original, strict=True):
        got, want = np.asarray(given), np.asarray(tf_value)
        if got.shape != want.shape:
            return None
        if not np.issubdtype(want.dtype, np.floating):
            if not np.array_equal(got, want):
                return None
            distance, bound = 0.0, 0.0
        else:
            if not (np.isfinite(got).all() and np.isfinite(want).all()):
                return None
            b = want.astype(np.float64)
            distance = scaled_error(got, b, error_floor(b, numeric.FLOOR_RATIO))
            bound = (factor - 1.0) / 2.0 * roundoff(want.dtype)
        if distance > bound:
            return None
        if distance >= worst:
            worst, name, allowed = distance, output, bound
    return Finding(True, name, worst, allowed, "")


def up(values: np.ndarray, ulps: int = 1) -> np.ndarray:
    for _ in range(ulps):
        values = np.nextafter(values, np.asarray(np.inf, values.dtype))
    return values


def cases() -> list[tuple[str, list[Any], list[Any]]]:
    big = RNG.standard_normal((96, 200)).astype(np.float32)  # larger than SAMPLE: the sample decides first
    other = (RNG.standard_normal(5000) * 1e3).astype(np.float32)
    small = RNG.standard_normal(40).astype(np.float32)
    ints = RNG.integers(-5, 5, 3000).astype(np.int32)
    out: list[tuple[str, list[Any], list[Any]]] = [
        ("equal", [big.copy(), other.copy()], [big, other]),
        ("one ulp everywhere", [up(big), up(other)], [big, other]),
        ("three ulps everywhere", [up(big, 3), up(other, 3)], [big, other]),
        ("small and integer", [up(small), ints.copy()], [small, ints]),
        ("float64", [up(big.astype(np.float64), 2)], [big.astype(np.float64)]),
        ("zeros", [np.zeros(3000, np.float32)], [np.zeros(3000, np.float32)]),
        ("other shape", [big.reshape(200, 96)], [big]),
    ]
    step = big.size // numeric.SAMPLE
    for what, index in (("a miss in a sampled element", 0), ("a miss only between the samples", step + 1)):
        faulty = big.copy()
        faulty.flat[index] *= 1.001
        out.append((what, [faulty, other.copy()], [big, other]))
        out.append((what + " (second output)", [big.copy(), faulty], [big, big]))
    for value in (np.nan, np.inf):
        for side in ("stitched", "original"):
            spoiled = big.copy()
            spoiled.flat[step + 1] = value
            pair = [[spoiled], [big]] if side == "stitched" else [[big.copy()], [spoiled]]
            out.append((f"{value} in the {side} result", pair[0], pair[1]))
    differing = ints.copy()
    differing[-1] += 1
    out.append(("an integer differing", [big.copy(), differing], [big, ints]))
    return out


def same(a: Finding | None, b: Finding | None) -> bool:
    if a is None or b is None:
        return a is b
    close = a.compiled_error == b.compiled_error or math.isclose(a.compiled_error, b.compiled_error, rel_tol=1e-12)
    return (a.ok, a.output, a.allowed, a.reason) == (b.ok, b.output, b.allowed, b.reason) and close


def test_the_fast_path_finds_what_it_finds_written_plainly() -> None:
    for what, stitched, original in cases():
        names = [f"out{i}" for i in range(len(stitched))]
        for factor in (8.0, 4.0):
            expected = plain_fast_path(names, stitched, original, factor)
            found = numeric._close_to_tf(names, stitched, original, factor)
            assert same(found, expected), (what, factor, found, expected)


def test_a_sampled_miss_is_decided_without_the_whole_distance(monkeypatch: Any) -> None:
    big = RNG.standard_normal(50_000).astype(np.float32)
    faulty = big.copy()
    faulty[:: big.size // numeric.SAMPLE] *= 1.01  # every sampled element
    whole: list[int] = []
    real = numeric._distance
    monkeypatch.setattr(numeric, "_distance", lambda *a: whole.append(1) or real(*a))
    assert numeric._close_to_tf(["a", "b"], [big.copy(), faulty], [big, big], 8.0) is None
    assert not whole  # the first output passes its sample, the second misses its own: no whole distance
