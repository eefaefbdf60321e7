"""Float transcendental functions as C that gcc vectorises: part of the generated code's prelude.

Input: csrc/vmath.h (package data). Output: `PRELUDE`, its text: C definitions of `sf_expf`, `sf_logf`,
`sf_log1pf`, `sf_tanhf` and `sf_erff`, and `FUNCTIONS`, the ops they implement.

Why: without -ffast-math gcc calls glibc's scalar expf/erff/tanhf, and one call in a loop
body keeps the whole body scalar (8-16x fewer elements per instruction than the
surrounding adds and loads). These versions are straight-line code (range reduction,
polynomials, selects instead of branches, bit casts through memcpy) that gcc -O3
vectorises with -ffp-contract=off and IEEE semantics kept: no fast-math, NaN, infinities,
signed zeros and subnormal results handled explicitly. Accuracy (checked against numpy in
float64 on two million inputs each by tests/compiler/targets/cpu/test_vmath.py, bounds asserted
there, native and portable builds): exp, log 1 ulp; tanh 1 ulp (bound 2); log1p, erf, sigmoid
2 ulp, i.e. as accurate as glibc's scalar versions are documented to be (1-2 ulp), where
libmvec allows 4. Sources of the methods:
- expf: Cody-Waite reduction x = n ln2 + r with the two-part ln2 of SLEEF, Cephes' expf
  polynomial, 2^n applied in two halves so subnormal results round once;
- logf: the FreeBSD/musl logf reduction to [sqrt(2)/2, sqrt(2)) and its polynomial;
- log1pf: log(1 + x) * x / ((1 + x) - 1) (Goldberg), exact-ish for tiny x;
- tanhf: Cephes' odd polynomial below 0.625, else 1 - 2 / (exp(2|x|) + 1);
- erff: x * P(x^2) up to 0.875 and 1 - exp(-x^2) * Q(1 / (1 + |x|/2)) above (coefficients
  fitted here by least squares in relative error on Chebyshev nodes; Q's argument from |x|
  clamped to 4). Both are evaluated (selects, no branches), but exp(-x^2) is written as the
  GELU graph writes it, so gcc computes it once for erf(x) and the graph's own exp(-x^2)
  (demo GELU cluster: 2.90 -> 2.04 M instructions a call on AVX2, scripts/kernel_instructions.py).
  A NaN needs no select of its own (it reaches the result through exp): -1.8% of a GELU forward
  cluster's instructions. scripts/kernel_erf_check.py checks every float in [0, 4.5] (2 ulp at most);
  a one-formula rational erf (Eigen's and XLA's form, 6 ulp) was tried and not kept: where 1 + erf(x)
  cancels (a GELU at negative x) its error is 9x numpy's (benchmarks/README.md, session 21).
Polynomial steps are fused multiply-adds where the target has FMA (`sf_fma`), a multiply and
an add where it has not (the portable build); the bounds hold for both (test_vmath runs both).
With -ffast-math (an explicit option) they would be miscompiled (the rounding shift of
expf folds away) and glibc's vector variants are used instead, so the names map to libm.
Double precision keeps glibc's functions (f64 clusters are rare; accuracy first).
"""

from __future__ import annotations

from importlib.resources import files

from stitchfleet.compiler.ir import Op

FUNCTIONS = {Op.EXP: "sf_expf", Op.LOG: "sf_logf", Op.LOG1P: "sf_log1pf", Op.TANH: "sf_tanhf", Op.ERF: "sf_erff"}

PRELUDE = files(__package__).joinpath("csrc", "vmath.h").read_text(encoding="utf-8")
