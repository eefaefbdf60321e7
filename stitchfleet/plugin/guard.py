"""The numeric guard's judgement of one cluster on one check step: stitched vs fp64 reference.

Input: the cluster graph, the values its inputs had in the step, what the original TF ops
computed from them and what the stitched path gave the training step. Output: a `Finding`
(the worst output's figures under `tolerance.check`, the rule every backend test uses,
with the reference from `evaluate` in float64 on the same inputs). One allowance on top:
when TF's own result happens to be nearly exact, a stitched result is still accepted
within `factor` times the rigorous rounding bound of its longest reduction (length x unit
roundoff): a different summation order is not a bug, and a false revert costs the fleet
its savings for that cluster for good.

Fast path: when every stitched output is finite and within (factor - 1) / 2 units of roundoff
of TF's own result (scaled like the rule: by |value| + floor), the rule holds whatever the
reference is (|stitched - ref| <= |stitched - TF| + |TF - ref|), so the fp64 evaluation, which
costs 1-25 ms per cluster on the demo model, is skipped. Anything further off, non-finite or an
integer output that differs is judged against fp64 as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.tolerance import Verdict, check, error_floor, roundoff, scaled_error

# Elements below 1% of an output's RMS are judged against that floor: gradients cancel, and a
# near-zero element's relative error says nothing about the kernel (corruptions are O(1)).
FLOOR_RATIO = 1e-2


@dataclass(frozen=True)
class Finding:
    ok: bool
    output: str
    compiled_error: float
    allowed: float
    reason: str

    @property
    def ratio(self) -> float | None:
        """How many times the allowed error the stitched result is off (finite figures only)."""
        if not math.isfinite(self.compiled_error) or self.allowed <= 0:
            return None
        return self.compiled_error / self.allowed


def judge(
    graph: Graph, inputs: Sequence[Any], original: Sequence[Any], stitched: Sequence[Any], factor: float
) -> Finding:
    """The worst output of the cluster on this step (see the module docstring)."""
    outputs = [name for name, _ in graph.outputs]
    close = _close_to_tf(outputs, stitched, original, factor)
    if close is not None:
        return close
    names = [str(p.attrs["name"]) for p in graph.parameters]
    given = {n: np.asarray(v) for n, v in zip(names, inputs, strict=True)}
    reference = evaluate(graph, given, "float64")
    verdicts = {
        name: check(got, want, reference[name], factor=factor, floor_ratio=FLOOR_RATIO)
        for name, got, want in zip(outputs, stitched, original, strict=True)
    }
    bound = _reduction_length(graph)
    verdicts = {
        n: _summation_allowance(v, np.asarray(s).dtype, bound, factor)
        for (n, v), s in zip(verdicts.items(), stitched, strict=True)
    }
    name, worst = max(verdicts.items(), key=lambda item: (not item[1].ok, item[1].compiled_error))
    return Finding(worst.ok, name, worst.compiled_error, worst.allowed, worst.reason)


def _close_to_tf(
    outputs: Sequence[str], stitched: Sequence[Any], original: Sequence[Any], factor: float
) -> Finding | None:
    """A passing Finding when every output is provably within the rule without fp64 (module docstring)."""
    worst, name, allowed = 0.0, outputs[0] if outputs else "", 0.0
    for output, got, want in zip(outputs, stitched, original, strict=True):
        distance, bound = _distance(np.asarray(got), np.asarray(want)), _fast_bound(np.asarray(want).dtype, factor)
        if distance is None or distance > bound:
            return None
        if distance >= worst:
            worst, name, allowed = distance, output, bound
    return Finding(True, name, worst, allowed, "")


def _fast_bound(dtype: np.dtype[Any], factor: float) -> float:
    return 0.0 if not np.issubdtype(dtype, np.floating) else (factor - 1.0) / 2.0 * roundoff(dtype)


def _distance(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> float | None:
    """max |got - want| / (|want| + floor); 0 for equal integers; None when only fp64 can judge (shapes
    differ, integers differ, a non-finite value on either side)."""
    if got.shape != want.shape:
        return None
    if not np.issubdtype(want.dtype, np.floating):
        return 0.0 if np.array_equal(got, want) else None
    a, b = got.astype(np.float64), want.astype(np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    return scaled_error(a, b, error_floor(b, FLOOR_RATIO))  # the rule's own distance, TF's result as reference


def _reduction_length(graph: Graph) -> int:
    """The most elements any reduction of the cluster sums into one value (1 without reductions)."""
    lengths = [
        int(np.prod(graph.node(n.inputs[0]).shape)) // max(int(np.prod(n.shape)), 1)
        for n in graph.nodes
        if n.op.name.startswith("REDUCE") and n.inputs
    ]
    return max(lengths, default=1)


def _summation_allowance(verdict: Verdict, dtype: np.dtype[Any], length: int, factor: float) -> Verdict:
    if verdict.ok or not math.isfinite(verdict.compiled_error) or not np.issubdtype(dtype, np.floating):
        return verdict
    allowed = factor * length * roundoff(dtype)
    if verdict.compiled_error <= allowed:
        return Verdict(True, verdict.compiled_error, verdict.native_error, allowed)
    return verdict
