"""The vectorised float64 erf (compiler/error_function.py) against the C library's, element by element."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler import elementwise, error_function


def _points() -> npt.NDArray[Any]:
    draw = np.random.default_rng(29)
    spread = draw.normal(0.0, 2.5, 200_000)
    # no subnormal value or ulp (from 1e-290 on): a process that ran TensorFlow may flush subnormals to zero (FTZ/DAZ:
    # CI's workers), so math.log(1e-310) raised and np.spacing(2.4e-298) read 0
    tiny = np.exp(draw.uniform(math.log(1e-290), math.log(1e-6), 20_000)) * draw.choice([-1.0, 1.0], 20_000)
    # each region's edges, and the values on either side of them
    edges = np.array([2.0**-28, 0.84375, 1.25, 1 / 0.35, 6.0, 27.9])
    near = np.concatenate([np.nextafter(edges, 0), edges, np.nextafter(edges, np.inf)])
    return np.concatenate([spread, tiny, near, -near, [0.0, -0.0, 40.0, -40.0]])


def test_every_region_agrees_with_the_c_library_to_an_ulp() -> None:
    x = _points()
    ours = error_function.erf(x)
    theirs = np.array([math.erf(v) for v in x])
    with np.errstate(divide="ignore", invalid="ignore"):  # equal values read 0 ulps whatever their spacing
        ulps = np.where(ours == theirs, 0.0, np.abs(ours - theirs) / np.spacing(np.abs(theirs)))
    assert ulps.max() <= 1.0, (x[ulps.argmax()], ours[ulps.argmax()], theirs[ulps.argmax()])
    assert np.array_equal(np.signbit(ours), np.signbit(theirs))  # erf(-0.0) is -0.0


def test_special_values_and_dtypes() -> None:
    ours = error_function.erf(np.array([np.nan, np.inf, -np.inf, 0.5], dtype=np.float32))
    assert ours.dtype == np.float64 and np.isnan(ours[0])
    assert ours[1:3].tolist() == [1.0, -1.0] and ours[3] == math.erf(float(np.float32(0.5)))
    assert elementwise.erf(np.zeros((2, 3))).shape == (2, 3)  # the op table's erf is this one, shape kept
