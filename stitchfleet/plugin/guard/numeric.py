"""The numeric guard's judgement of one cluster on one check step: stitched vs fp64 reference.

Input: the cluster graph, the values its inputs had in the step, what the original TF ops computed from them
and what the stitched path gave the training step. The rules in full: docs/plugin/guard.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler import tolerance
from stitchfleet.compiler.blas_threads import one_blas_thread
from stitchfleet.compiler.evaluate import Array, evaluate
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.tolerance import OutputCheck, check, error_floor, output_of, roundoff, scaled_error

# Elements below 1% of an output's RMS are judged against that floor: gradients cancel, and a
# near-zero element's relative error says nothing about the kernel (corruptions are O(1)).
FLOOR_RATIO = 1e-2
# The summation allowance never exceeds this share of a value (see the module docstring), whatever
# the reductions: a fault as small as 1% stays ten times above it.
ALLOWANCE_CAP = 1e-3
# Elements of each output the fast path looks at first (evenly strided): most check steps miss the fast path
# (another summation order is a few ulps off on 1-90% of an output's elements, ab_jobs transformer), and an
# element beyond the bound in a sample is beyond it in the whole output, so the miss costs a sample.
SAMPLE = 1024


@dataclass(frozen=True)
class Finding:
    ok: bool
    output: str
    compiled_error: float
    allowed: float
    reason: str
    evidence: str = ""  # a miss's evidence line (`evidence.kept`): what a recheck judges again

    @property
    def detail(self) -> str:
        """The reason, and the evidence line under it when there is one (a revert's telemetry detail)."""
        return f"{self.reason}\n{self.evidence}" if self.evidence else self.reason

    @property
    def ratio(self) -> float | None:
        """How many times the allowed error the stitched result is off (finite figures only)."""
        if not math.isfinite(self.compiled_error) or self.allowed <= 0:
            return None
        return self.compiled_error / self.allowed


@one_blas_thread  # its spinning workers would slow the job's next steps
def judge(
    graph: Graph,
    inputs: Sequence[npt.ArrayLike],
    original: Sequence[npt.ArrayLike],
    stitched: Sequence[npt.ArrayLike],
    factor: float,
    *,
    reference: Mapping[str, Array] | None = None,
) -> Finding:
    """The worst output of the cluster on this step (see the module docstring); `reference`: the fp64
    outputs on these inputs when the caller already has them (judging several results of one step)."""
    outputs = [name for name, _ in graph.outputs]
    close = _close_to_tf(outputs, stitched, original, factor)
    if close is not None:
        return close
    names = [str(p.attrs["name"]) for p in graph.parameters]
    given = {n: np.asarray(v) for n, v in zip(names, inputs, strict=True)}
    if any(_other_shape(p.shape, given[n].shape) for n, p in zip(names, graph.parameters, strict=True)):
        # Inputs of another shape than the kernel's signature: TF's own ops computed both sides this step.
        return Finding(True, outputs[0], 0.0, 0.0, "inputs of another shape than the kernel's: TF's ops ran")
    if reference is None:
        reference = evaluate(graph, given, "float64")
    finding = judge_with_reference(graph, original, stitched, reference, factor)
    if finding.ok:
        return finding
    # Only a miss pays for the second legal order (the IR op by op in the outputs' precision), and only an
    # output that misses that too for the fp64 evaluations on perturbed inputs (cached: shared by the outputs).
    # A float64 output's reference is one more float64 order: the float32 evaluation sizes its rounding.
    draws = functools.cache(lambda draw: evaluate(graph, given, "float64", noise=draw))
    in_order = evaluate(graph, given)
    narrow = evaluate(graph, given, "float32") if any(np.asarray(v).dtype == np.float64 for v in original) else None
    return judge_with_reference(
        graph, original, stitched, reference, factor, in_order=in_order, perturbed=draws, narrow=narrow
    )


def _other_shape(declared: Sequence[int], given: Sequence[int]) -> bool:
    """Whether an input's shape differs from its parameter's (one with a negative dimension is not read)."""
    if any(d < 0 for d in declared):
        return False
    return tuple(declared) != tuple(given)


def judge_with_reference(
    graph: Graph,
    original: Sequence[npt.ArrayLike],
    stitched: Sequence[npt.ArrayLike],
    reference: Mapping[str, Array],
    factor: float,
    *,
    in_order: Mapping[str, Array] | None = None,
    perturbed: Callable[[int], Mapping[str, Array]] | None = None,
    narrow: Mapping[str, Array] | None = None,
) -> Finding:
    """The rule against the fp64 reference, with each output's summation allowance (no fast path).
    `in_order`: the cluster evaluated op by op in float32 on the same inputs, a second legal rounding
    order the stitched result may be compared with; `perturbed`: draw number -> the fp64 outputs on
    perturbed inputs, for the backward-stability allowance of an output that misses the rest (module
    docstring); `narrow`: the cluster evaluated in float32, which sizes the rounding a float64 output's
    reference carries (tolerance.rounding_at)."""
    outputs = [name for name, _ in graph.outputs]
    low = {name: None if narrow is None else narrow[name] for name in outputs}
    order = {name: None if in_order is None else in_order[name] for name in outputs}
    output_checks = {
        name: _either_order(got, want, order[name], reference[name], factor, narrow=low[name])
        for name, got, want in zip(outputs, stitched, original, strict=True)
    }
    paths = reduction_paths(graph)
    output_checks = {
        n: _summation_allowance(v, np.asarray(s).dtype, paths[n], factor)
        for (n, v), s in zip(output_checks.items(), stitched, strict=True)
    }
    if perturbed is not None:
        output_checks = {
            n: v if v.ok else _sensitive(got, want, reference[n], factor, output_of(perturbed, n), narrow=low[n])
            for (n, v), got, want in zip(output_checks.items(), stitched, original, strict=True)
        }
    name, worst = max(output_checks.items(), key=lambda item: (not item[1].ok, item[1].compiled_error))
    return Finding(worst.ok, name, worst.compiled_error, worst.allowed, worst.reason)


def _either_order(
    got: Any, tf_value: Any, in_order: Any, reference: Any, factor: float, *, narrow: Any = None
) -> OutputCheck:
    """The rule with TF's result as the native one, or else with the IR's own float32 evaluation."""
    output_check = check(got, tf_value, reference, factor=factor, floor_ratio=FLOOR_RATIO, narrow=narrow)
    if output_check.ok or in_order is None or np.asarray(in_order).shape != np.asarray(tf_value).shape:
        return output_check
    if not np.issubdtype(np.asarray(tf_value).dtype, np.floating):
        return output_check  # integers must equal TF's own, whatever the order
    second = check(
        got, np.asarray(in_order, dtype=np.asarray(tf_value).dtype), reference, factor=factor, floor_ratio=FLOOR_RATIO
    )
    return second if second.ok else output_check


def _sensitive(
    got: Any, tf_value: Any, reference: Any, factor: float, perturbed: Callable[[int], object], *, narrow: Any = None
) -> OutputCheck:
    """The rule against TF's result with the backward-stability allowance (tolerance.py's second look)."""
    return check(got, tf_value, reference, factor=factor, floor_ratio=FLOOR_RATIO, perturbed=perturbed, narrow=narrow)


def _close_to_tf(
    outputs: Sequence[str], stitched: Sequence[Any], original: Sequence[Any], factor: float
) -> Finding | None:
    """A passing Finding when every output is provably within the rule without fp64 (module docstring)."""
    pairs = [(np.asarray(got), np.asarray(want)) for got, want in zip(stitched, original, strict=True)]
    sampled = [_sampled(got, want, _fast_bound(want.dtype, factor)) for got, want in pairs]
    if any(miss for miss, _ in sampled):  # a miss anywhere is a miss: no output's whole distance is needed
        return None
    worst, name, allowed = 0.0, outputs[0] if outputs else "", 0.0
    for output, (got, want), (_, floor) in zip(outputs, pairs, sampled, strict=True):
        distance, bound = _distance(got, want, floor), _fast_bound(want.dtype, factor)
        if distance is None or distance > bound:
            return None
        if distance >= worst:
            worst, name, allowed = distance, output, bound
    return Finding(True, name, worst, allowed, "")


def _fast_bound(dtype: np.dtype[Any], factor: float) -> float:
    return 0.0 if not np.issubdtype(dtype, np.floating) else (factor - 1.0) / 2.0 * roundoff(dtype)


def _tf_floor(want: np.ndarray[Any, Any], widened: npt.NDArray[np.float64]) -> float | None:
    """error_floor(want in float64, FLOOR_RATIO), leaving `widened` (want's shape) holding want in float64;
    None where the sum of squares is not finite (a non-finite element, or float64 values that overflow)."""
    np.copyto(widened, want)
    flat = widened.reshape(-1)
    squares = float(np.dot(flat, flat))  # another summation order than error_floor's mean: float64 rounding
    return tolerance.rms_floor(squares, flat.size, FLOOR_RATIO) if math.isfinite(squares) else None


def _sampled(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], bound: float) -> tuple[bool, float | None]:
    """(miss, floor): a miss when SAMPLE strided elements already put the output beyond `bound` (as `_distance`
    would find with the same floor), and the floor it used; (False, None) where the sample decides nothing
    (small, integer, non-finite or overflowing outputs: `_distance` decides)."""
    if got.shape != want.shape:
        return True, None
    if not np.issubdtype(want.dtype, np.floating) or want.size <= SAMPLE:
        return False, None
    with np.errstate(all="ignore"):
        floor = _tf_floor(want, tolerance.scratch(want.shape)[1])
        if floor is None:
            return False, None
        step = want.size // SAMPLE
        picked, reference = got.reshape(-1)[::step], want.reshape(-1)[::step].astype(np.float64)
        # scaled_error's arithmetic on those elements: a ratio above the bound (or nan) is a miss
        ratio = np.abs(np.subtract(picked, reference, dtype=np.float64)) / (np.abs(reference) + floor)
        return not float(np.max(ratio)) <= bound, floor


def _distance(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], floor: float | None = None) -> float | None:
    """max |got - want| / (|want| + floor); 0 for equal integers; None when only fp64 can judge (shapes
    differ, integers differ, a non-finite value on either side). `floor`: `_tf_floor`'s, when known."""
    if got.shape != want.shape:
        return None
    if not np.issubdtype(want.dtype, np.floating):
        return 0.0 if np.array_equal(got, want) else None
    if want.size:
        with np.errstate(all="ignore"):  # a non-finite distance goes to the general form below
            diff, widened = tolerance.scratch(want.shape)
            if floor is None:
                floor = _tf_floor(want, widened)
            else:
                np.copyto(widened, want)
            if floor is not None:
                tolerance.widened_difference(got, widened, diff)
                np.abs(widened, out=widened)
                widened += floor
                distance = tolerance.largest_ratio(diff, widened)
                if math.isfinite(distance):  # so every element of both is finite
                    return distance
    # finite before or after the widening alike; `got` widens inside scaled_error (no float64 copy of it here)
    if not (np.isfinite(got).all() and np.isfinite(want).all()):
        return None
    b = want.astype(np.float64)
    return scaled_error(got, b, error_floor(b, FLOOR_RATIO))  # the rule's own distance, TF's result as reference


def reduction_lengths(graph: Graph) -> dict[int, int]:
    """Per reduction node: how many elements it sums into one value."""
    return {
        node.id: int(np.prod(graph.node(node.inputs[0]).shape)) // max(int(np.prod(node.shape)), 1)
        for node in graph.nodes
        if node.op.name.startswith("REDUCE") and node.inputs
    }


def reduction_paths(graph: Graph) -> dict[str, list[int]]:
    """Per output: the lengths of the reductions its value depends on (each reduction once)."""
    length = reduction_lengths(graph)
    upstream: dict[int, frozenset[int]] = {}
    for node in graph.nodes:  # topological order: a node's inputs come first
        found = frozenset().union(*(upstream[i] for i in node.inputs)) if node.inputs else frozenset()
        upstream[node.id] = found | {node.id} if node.id in length else found
    return {name: sorted(length[r] for r in upstream[node_id]) for name, node_id in graph.outputs}


def summation_allowance(dtype: np.dtype[np.generic], lengths: Sequence[int], factor: float) -> float:
    """factor x u x sum(sqrt(L)) over the output's reductions (at least factor x u), capped (module docstring)."""
    u = roundoff(dtype)
    spread = max(1.0, sum(math.sqrt(length) for length in lengths))
    return min(factor * u * spread, max(ALLOWANCE_CAP, factor * u))


def _summation_allowance(
    output_check: OutputCheck, dtype: np.dtype[Any], lengths: Sequence[int], factor: float
) -> OutputCheck:
    if output_check.ok or not math.isfinite(output_check.compiled_error) or not np.issubdtype(dtype, np.floating):
        return output_check
    allowed = summation_allowance(dtype, lengths, factor)
    if output_check.compiled_error <= allowed:
        return OutputCheck(True, output_check.compiled_error, output_check.native_error, allowed)
    return output_check
