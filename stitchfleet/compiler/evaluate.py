"""The reference interpreter: the definition of what every IR op means, in numpy.

Input: a `Graph`, a mapping parameter name -> numpy array, and a precision:
"native" computes every op in its own dtype (the unfused result a framework would
give), "float64" computes every floating-point value in float64 (the guard's
reference), "float32" every one in float32 (a float64 graph a precision lower),
"storage" every op in its own dtype with sums accumulating in it too (float16 sums as
TensorFlow's CPU kernels make them, in float16).
Output: a dict output name -> array. Bad inputs (missing, unexpected,
wrong shape or dtype) raise `InputError` naming the input. In float64, `noise` (a draw
number) evaluates the reference on inputs one rounding away instead: the tolerance
rule's backward-stability allowance (tolerance.py) measures how far that moves it.

bf16 has no numpy type: a bf16 value is held in float32 and rounded to the nearest
bf16 (ties to even) after every op that produces bf16, which is what bf16 storage does.
f16 and bf16 reductions accumulate in float32 and round once, as TensorFlow's GPU
kernels do.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.elementwise import BINARY, UNARY
from stitchfleet.compiler.ir import DType, Graph, Node, Op, is_static
from stitchfleet.compiler.tolerance import noise_of, roundoff

Array = npt.NDArray[Any]
# "float32": every float value held in float32 (a float64 graph computed a precision lower, so that the guard can
# size float64 rounding from it: tolerance.rounding_at); "storage": native, float16 sums accumulated in float16
# (the translation check's measure of TF's CPU rounding)
Precision = Literal["native", "float64", "float32", "storage"]
PRECISIONS = ("native", "float64", "float32", "storage")
NOISE_SEED = 20261123  # with the draw number: the same noise on every run, so a check is reproducible


class EvaluationError(ValueError):
    """The graph cannot be evaluated (an opaque op with no reference meaning, a dynamic result)."""


class OpaqueError(EvaluationError):
    """The graph holds an opaque op (a convolution, a pooling gradient) that has no meaning here."""


class InputError(EvaluationError):
    """An input is missing, unexpected, or of the wrong shape or dtype."""


def round_bf16(values: Array) -> Array:
    """Rounds float32 values to the nearest bfloat16 (ties to even), kept in float32."""
    as_f32 = np.array(values, dtype=np.float32, ndmin=1)
    bits = as_f32.view(np.uint32).astype(np.uint64)
    odd = (bits >> np.uint64(16)) & np.uint64(1)
    kept = (bits + np.uint64(0x7FFF) + odd) & np.uint64(0xFFFF0000)
    rounded = kept.astype(np.uint32).view(np.float32)
    result: Array = np.where(np.isnan(as_f32), as_f32, rounded).reshape(np.shape(values))
    return result


def _storage(dtype: DType, precision: Precision) -> np.dtype[np.generic]:
    if precision == "float64" and dtype.is_float:
        return np.dtype(np.float64)
    if precision == "float32" and dtype.is_float:
        return np.dtype(np.float32)
    return dtype.numpy


def _store(values: object, dtype: DType, precision: Precision) -> Array:
    """Converts a computed value to how `dtype` holds it (rounding bf16 in native mode)."""
    array = np.asarray(values).astype(_storage(dtype, precision), copy=False)
    if dtype is DType.BF16 and precision in ("native", "storage"):
        return round_bf16(array)
    return array


def _accumulator(array: Array) -> np.dtype[np.generic]:
    return np.dtype(np.float32) if array.dtype == np.float16 else array.dtype


_REDUCE: dict[Op, Callable[..., Array]] = {
    Op.REDUCE_SUM: np.sum,
    Op.REDUCE_MAX: np.max,
    Op.REDUCE_MIN: np.min,
    Op.REDUCE_MEAN: np.mean,
    Op.REDUCE_PROD: np.prod,
}


def _broadcast(node: Node, x: Array) -> Array:
    dims = node.attrs.get_ints("dims")
    expanded = [1] * len(node.shape)
    for i, d in enumerate(dims):
        expanded[d] = x.shape[i]
    return np.broadcast_to(x.reshape(expanded), node.shape)


def _slice(node: Node, x: Array) -> Array:
    a = node.attrs
    index = tuple(
        slice(b, e, s) for b, e, s in zip(a.get_ints("begin"), a.get_ints("end"), a.get_ints("strides"), strict=True)
    )
    return x[index]


def _reduce(node: Node, x: Array, precision: Precision) -> Array:
    axes = node.attrs.get_ints("axes")
    acc = x.dtype if precision == "storage" else _accumulator(x)
    if node.op in (Op.REDUCE_MAX, Op.REDUCE_MIN):
        return _REDUCE[node.op](x, axis=axes)
    return _REDUCE[node.op](x, axis=axes, dtype=acc)


def _constant(node: Node) -> Array:
    value = node.attrs.get("value")
    if isinstance(value, tuple):
        return np.asarray(value, dtype=np.float64).reshape(node.shape)
    return np.full(node.shape, value, dtype=np.float64)


def _matmul(a: Array, b: Array, adj_a: bool, adj_b: bool) -> Array:
    left = np.swapaxes(a, -1, -2) if adj_a else a
    right = np.swapaxes(b, -1, -2) if adj_b else b
    product: Array = np.matmul(left, right)
    return product


def _opaque(node: Node, args: Sequence[Array]) -> Array:
    """Reference meaning for the opaque ops a frontend commonly leaves in clusters' neighbourhood."""
    kind = node.attrs.get_str("type")
    flag = node.attrs.get
    if kind == "MatMul" and len(args) == 2:
        return _matmul(args[0], args[1], bool(flag("transpose_a")), bool(flag("transpose_b")))
    if kind in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3") and len(args) == 2:
        return _matmul(args[0], args[1], bool(flag("adj_x")), bool(flag("adj_y")))
    if kind == "Identity" and len(args) == 1:
        return args[0]
    raise OpaqueError(f"{node.label}: OPAQUE op type {kind!r} has no reference meaning in evaluate")


def _compute(node: Node, args: Sequence[Array], precision: Precision) -> object:
    op = node.op
    if op in UNARY:
        return UNARY[op](args[0])
    if op in BINARY:
        return BINARY[op](args[0], args[1])
    handlers: dict[Op, Callable[[], object]] = {
        Op.CAST: lambda: args[0],
        Op.SELECT: lambda: np.where(args[0], args[1], args[2]),
        Op.BROADCAST: lambda: _broadcast(node, args[0]),
        Op.RESHAPE: lambda: args[0].reshape(node.shape),
        Op.TRANSPOSE: lambda: np.transpose(args[0], node.attrs.get_ints("perm")),
        Op.SLICE: lambda: _slice(node, args[0]),
        Op.CONCAT: lambda: np.concatenate(args, axis=node.attrs.get_int("axis")),
        Op.CONSTANT: lambda: _constant(node),
        Op.OPAQUE: lambda: _opaque(node, args),
    }
    if op.is_reduction:
        return _reduce(node, args[0], precision)
    return handlers[op]()


def _check_inputs(graph: Graph, inputs: Mapping[str, object]) -> dict[str, Array]:
    params = {str(p.attrs["name"]): p for p in graph.parameters}
    missing = sorted(set(params) - set(inputs))
    if missing:
        raise InputError(f"missing input(s): {', '.join(missing)}")
    extra = sorted(set(inputs) - set(params))
    if extra:
        raise InputError(f"unexpected input(s): {', '.join(extra)} (graph parameters: {', '.join(sorted(params))})")
    return {name: _check_input(name, params[name], inputs[name]) for name in params}


def _check_input(name: str, param: Node, value: object) -> Array:
    array = np.asarray(value)
    expected = f"{param.dtype.value}{list(param.shape)}"
    if array.dtype != param.dtype.numpy:
        raise InputError(f"input {name!r}: dtype {array.dtype} does not match the parameter's {expected}")
    matches = len(array.shape) == len(param.shape) and all(
        d in (-1, s) for d, s in zip(param.shape, array.shape, strict=True)
    )
    if not matches:
        raise InputError(f"input {name!r}: shape {list(array.shape)} does not match the parameter's {expected}")
    return array


def _perturb(value: Array, dtype: DType, rng: np.random.Generator, amplitude: float) -> Array:
    """`value` (float64) times 1 + e, e uniform in [-a u, a u] per element (u: the unit roundoff of `dtype`,
    a: `amplitude`): at 1, the relative error one round-to-nearest into `dtype` may make."""
    if not dtype.is_float:
        return value
    u = roundoff(dtype.numpy, bf16=dtype is DType.BF16)
    # drawn before scaling: a twin draw (tolerance.noise_of) has its draw's direction exactly
    direction = rng.uniform(-1.0, 1.0, value.shape)
    noisy: Array = np.asarray(value * (1.0 + amplitude * u * direction), dtype=np.float64)
    return noisy


# Element-wise ops whose result has their operands' dtype: in float64 a dead value's array of the result's
# shape can take the result (out=), as numpy's own temporary elision does. A fresh array per op cost more than
# its arithmetic on a check step: freed arrays went back to the OS and came back as page faults (ab_jobs
# transformer, 262k-element values).
_IN_PLACE = {
    Op.NEG,
    Op.ABS,
    Op.SQUARE,
    Op.FLOOR,
    Op.CEIL,
    Op.EXP,
    Op.LOG,
    Op.LOG1P,
    Op.TANH,
    Op.SQRT,
    Op.ADD,
    Op.SUB,
    Op.MUL,
    Op.DIV,
    Op.POW,
    Op.MAXIMUM,
    Op.MINIMUM,
}


def _references(values: Sequence[Array | None], i: int) -> int:
    """How many references this interpreter counts to the array `values[i]` (another value that is the same
    array, or a view of it, adds one)."""
    return sys.getrefcount(values[i])


# the count of an array the values list alone holds, measured here (interpreters count their own references)
_SOLE = _references([np.empty(1)], 0)
Pool = dict[tuple[int, ...], list[Array]]  # shape -> float64 arrays of dead values, free to take a result
# The pool outlives an evaluation (per thread): a check step evaluates its clusters one after another, and the
# next one's values take the arrays the last one's dead values left, up to this many bytes held between calls.
POOL_BYTES = 32 << 20
_POOLS = threading.local()


def _kept_pool() -> Pool:
    pool: Pool | None = getattr(_POOLS, "pool", None)
    if pool is None:
        pool = _POOLS.pool = {}
    return pool


def _last_uses(graph: Graph) -> dict[int, list[int]]:
    """Per node id: its operands that no later node reads and that are not outputs (dead once it is computed)."""
    last: dict[int, int] = {}
    for node in graph.nodes:
        for i in node.inputs:
            last[i] = node.id
    kept = {node_id for _, node_id in graph.outputs}
    dead: dict[int, list[int]] = {}
    for value, user in last.items():
        if value not in kept:
            dead.setdefault(user, []).append(value)
    return dead


def _target(node: Node, args: Sequence[Array], pool: Pool) -> Array | None:
    """A free array for `node`'s result: an element-wise op on float64 operands whose result has its shape."""
    if node.op not in _IN_PLACE or any(a.dtype != np.float64 for a in args):
        return None
    free = pool.get(tuple(node.shape))
    return free.pop() if free else None


def _release(values: list[Array | None], dead: Sequence[int], pool: Pool) -> None:
    """Moves the dead values' float64 arrays that no other value holds (nor views) to the pool, up to POOL_BYTES;
    the rest stay where they are (freeing them as they die made the heap shrink and grow again: page faults)."""
    held = sum(a.nbytes for free in pool.values() for a in free)
    for i in dead:
        array = values[i]
        if array is None or array.dtype != np.float64 or not array.flags.c_contiguous:
            continue
        sole = array.flags.owndata and array.flags.writeable and _references(values, i) <= _SOLE + 1  # + `array`
        if sole and array.nbytes <= POOL_BYTES:
            held = _make_room(pool, held, array.nbytes)
            pool[array.shape] = [*pool.pop(array.shape, []), array]  # its shape now the most recently released
            values[i] = None
            held += array.nbytes


def _make_room(pool: Pool, held: int, needed: int) -> int:
    """Drops the pool's arrays, the shapes released least recently first, until `needed` more bytes fit under
    POOL_BYTES; the bytes it holds then. Why: a pool full of another graph's shapes (earlier check steps, other
    models in the process) took nothing new, so no later evaluation reused an array (CI: a worker's earlier tests)."""
    for shape in list(pool):
        free = pool[shape]
        while free and held + needed > POOL_BYTES:
            held -= free.pop(0).nbytes
        if not free:
            del pool[shape]
        if held + needed <= POOL_BYTES:
            break
    return held


def evaluate_nodes(
    graph: Graph, inputs: Mapping[str, object], precision: Precision = "native", *, noise: int | None = None
) -> list[Array]:
    """Every node's value, in node order (for checking intermediate results); `noise`: see `_evaluate`."""
    return [value for value in _evaluate(graph, inputs, precision, noise=noise, reuse=False) if value is not None]


def _evaluate(
    graph: Graph, inputs: Mapping[str, object], precision: Precision, *, noise: int | None, reuse: bool
) -> list[Array | None]:
    """Every node's value, in node order (for checking intermediate results). `noise` (float64 only): a
    draw number; every floating input is perturbed by one unit roundoff of its dtype (`_perturb`), drawn
    from a generator seeded with NOISE_SEED and the draw's direction (a linearity twin: the same direction
    at a fraction of the amplitude, `tolerance.noise_of`). Only the inputs: noise on intermediate values
    would also break the graph's own exact relations (a max-pool gradient's x == max(x)), which is not
    rounding any float32 evaluation makes."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if noise is not None and precision != "float64":
        raise ValueError("noise on the inputs is for the float64 reference only: native storage would round it away")
    direction, amplitude = (0, 0.0) if noise is None else noise_of(noise)
    rng = None if noise is None else np.random.default_rng((NOISE_SEED, direction))
    given = _check_inputs(graph, inputs)
    values: list[Array | None] = []
    pool = _kept_pool() if reuse and precision == "float64" else None
    dead = _last_uses(graph) if pool is not None else {}
    with np.errstate(all="ignore"):  # inf/nan results are data here; the guard judges them
        for node in graph.nodes:
            if node.op is Op.PARAMETER:
                values.append(_parameter(node, given, precision, rng, amplitude, pool=pool))
                continue
            args = cast("list[Array]", [values[i] for i in node.inputs])  # a value is dropped after its last read
            target = None if pool is None else _target(node, args, pool)
            if target is None:
                result = _store(_compute(node, args, precision), node.dtype, precision)
            else:  # the ufunc `_compute` would call, its result in a dead value's array (float64 already)
                ufunc: Callable[..., Array] = UNARY.get(node.op) or BINARY[node.op]
                result = ufunc(*args, out=target)
            del args, target
            if is_static(node.shape) and result.shape != node.shape:
                raise EvaluationError(f"{node.label}: produced shape {result.shape}, expected {node.shape}")
            values.append(result)
            del result  # no name but the list's may hold a value (`_release` counts references)
            if pool is not None:
                _release(values, dead.get(node.id, ()), pool)
    if pool is not None:  # what no output holds is free for the next evaluation
        kept = {node_id for _, node_id in graph.outputs}
        _release(values, [i for i in range(len(values)) if i not in kept], pool)
    return values


def _parameter(
    node: Node,
    given: Mapping[str, Array],
    precision: Precision,
    rng: np.random.Generator | None,
    amplitude: float,
    *,
    pool: Pool | None,
) -> Array:
    """A parameter's value: its input as the node's dtype stores it, held at `precision` (a copy, in a pooled
    array where there is one), perturbed where `rng` draws noise."""
    stored = _store(given[str(node.attrs["name"])], node.dtype, "native")
    storage = _storage(node.dtype, precision)
    free = pool.get(stored.shape) if pool is not None and storage == np.float64 else None
    if free:
        value = free.pop()
        np.copyto(value, stored)  # the conversion astype makes
    else:
        value = stored.astype(storage)
    return value if rng is None else _perturb(value, node.dtype, rng, amplitude)


def evaluate(
    graph: Graph, inputs: Mapping[str, object], precision: Precision = "native", *, noise: int | None = None
) -> dict[str, Array]:
    """The graph's named outputs on `inputs` (`noise`: see `evaluate_nodes`)."""
    values = _evaluate(graph, inputs, precision, noise=noise, reuse=True)
    return {name: cast("Array", values[node_id]) for name, node_id in graph.outputs}  # outputs are never dropped


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, Array]:
    """Well-conditioned random inputs for every parameter (normal floats, small ints, fair bools)."""
    rng = np.random.default_rng(seed)
    out: dict[str, Array] = {}
    for param in graph.parameters:
        shape = tuple(max(d, 1) for d in param.shape)
        if param.dtype.is_float:
            out[str(param.attrs["name"])] = _store(rng.standard_normal(shape), param.dtype, "native")
        elif param.dtype is DType.BOOL:
            out[str(param.attrs["name"])] = rng.random(shape) < 0.5
        else:
            out[str(param.attrs["name"])] = rng.integers(-8, 8, shape).astype(param.dtype.numpy)
    return out
