"""The subgraph benchmark suite of BENCHMARKS.md, built with the GraphBuilder as IR JSON.

Input: a case name, a shape and a dtype (or the command line: `python -m
benchmarks.suite --out benchmarks/suite/`). Output: a `Graph` whose metadata holds
the case, its sizes and its IO-bytes formula (the bytes a perfect kernel reads and
writes: unique inputs plus outputs), or one small JSON file per case, shape and dtype.
Where a case says "f16 in / f32 compute", low-precision data is cast to f32, computed,
and cast back, as mixed-precision training graphs do.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.compiler.ir import DType, Graph, GraphBuilder, Value, save

EPS = 1e-5
SQRT2 = math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[GraphBuilder, tuple[int, ...], str], None]
    formula: str  # python arithmetic over the size names and `isz` (data element bytes)
    sizes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]


def _compute(b: GraphBuilder, x: Value) -> Value:
    return b.cast(x, "f32")


def _layernorm(b: GraphBuilder, x: Value, gamma: Value, beta: Value, axis: int = -1) -> Value:
    mean = b.reduce_mean(x, (axis,), keepdims=True)
    centered = x - mean
    var = b.reduce_mean(b.square(centered), (axis,), keepdims=True)
    return centered * b.rsqrt(var + EPS) * gamma + beta


def layernorm_fwd(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    rows, cols = shape
    x = b.parameter("x", (rows, cols), dtype)
    gamma, beta = b.parameter("gamma", (cols,)), b.parameter("beta", (cols,))
    b.output("y", b.cast(_layernorm(b, _compute(b, x), gamma, beta), dtype))


def layernorm_bwd(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    rows, cols = shape
    dy, x = _compute(b, b.parameter("dy", shape, dtype)), _compute(b, b.parameter("x", shape, dtype))
    gamma = b.parameter("gamma", (cols,))
    mean = b.reshape(b.parameter("mean", (rows,)), (rows, 1))
    rstd = b.reshape(b.parameter("rstd", (rows,)), (rows, 1))
    xhat = (x - mean) * rstd
    b.output("dgamma", b.reduce_sum(dy * xhat, (0,)))
    b.output("dbeta", b.reduce_sum(dy, (0,)))
    g = dy * gamma
    mean_g = b.reduce_mean(g, (1,), keepdims=True)
    mean_gx = b.reduce_mean(g * xhat, (1,), keepdims=True)
    b.output("dx", b.cast(rstd * (g - mean_g - xhat * mean_gx), dtype))


def rmsnorm_fwd(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    _, cols = shape
    x = _compute(b, b.parameter("x", shape, dtype))
    gamma = b.parameter("gamma", (cols,))
    rstd = b.rsqrt(b.reduce_mean(b.square(x), (1,), keepdims=True) + EPS)
    b.output("y", b.cast(x * rstd * gamma, dtype))


def rmsnorm_bwd(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    rows, cols = shape
    dy, x = _compute(b, b.parameter("dy", shape, dtype)), _compute(b, b.parameter("x", shape, dtype))
    gamma = b.parameter("gamma", (cols,))
    rstd = b.reshape(b.parameter("rstd", (rows,)), (rows, 1))
    b.output("dgamma", b.reduce_sum(dy * x * rstd, (0,)))
    g = dy * gamma
    mean_gx = b.reduce_mean(g * x, (1,), keepdims=True)
    b.output("dx", b.cast(rstd * (g - x * (rstd * rstd) * mean_gx), dtype))


def _softmax(b: GraphBuilder, x: Value) -> Value:
    shifted = b.exp(x - b.reduce_max(x, (-1,), keepdims=True))
    return shifted / b.reduce_sum(shifted, (-1,), keepdims=True)


def softmax_fwd(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    b.output("y", b.cast(_softmax(b, _compute(b, b.parameter("x", shape, dtype))), dtype))


def softmax_bwd(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    y, dy = _compute(b, b.parameter("y", shape, dtype)), _compute(b, b.parameter("dy", shape, dtype))
    b.output("dx", b.cast(y * (dy - b.reduce_sum(dy * y, (1,), keepdims=True)), dtype))


def attention_softmax(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    batch, _, seq, _ = shape
    scores = _compute(b, b.parameter("scores", shape, dtype))
    mask = b.parameter("mask", (batch, 1, 1, seq), "f32")
    b.output("probs", b.cast(_softmax(b, scores * (1.0 / math.sqrt(64.0)) + mask), dtype))


def _gelu(b: GraphBuilder, v: Value) -> Value:
    return 0.5 * v * (1.0 + b.erf(v * (1.0 / SQRT2)))


def bias_gelu_fwd(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    x = _compute(b, b.parameter("x", shape, dtype))
    bias = b.parameter("bias", (shape[1],))
    b.output("y", b.cast(_gelu(b, x + bias), dtype))


def gelu_bwd_bias_grad(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    dy, x = _compute(b, b.parameter("dy", shape, dtype)), _compute(b, b.parameter("x", shape, dtype))
    v = x + b.parameter("bias", (shape[1],))
    pdf = b.exp(v * v * -0.5) * INV_SQRT_2PI
    dx = dy * (0.5 * (1.0 + b.erf(v * (1.0 / SQRT2))) + v * pdf)
    b.output("dx", b.cast(dx, dtype))
    b.output("dbias", b.reduce_sum(dx, (0,)))


def dropout_residual_layernorm(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    cols = shape[1]
    x, residual = b.parameter("x", shape, dtype), b.parameter("residual", shape, dtype)
    keep = b.parameter("keep", shape, "bool")
    h = b.select(keep, x * (1.0 / 0.9), 0.0) + residual
    b.output("h", h)
    b.output("y", _layernorm(b, h, b.parameter("gamma", (cols,)), b.parameter("beta", (cols,))))


def cross_entropy_fwd(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    logits, onehot = b.parameter("logits", shape, dtype), b.parameter("onehot", shape, dtype)
    top = b.reduce_max(logits, (1,), keepdims=True)
    lse = b.log(b.reduce_sum(b.exp(logits - top), (1,), keepdims=True)) + top
    nll = b.reduce_sum(onehot * (lse - logits), (1,))
    b.output("loss", b.reduce_mean(nll, (0,)))


def astitch_fig7(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    """Fig. 7 of the AStitch paper: add, reduce, broadcast, divide, power, reduce, broadcast, multiply."""
    a = b.parameter("p0", shape, dtype) + b.parameter("p1", shape, dtype)
    divided = a / b.reduce_sum(a, (1,), keepdims=True)
    powered = b.pow(divided, 2.0)
    b.output("out", divided * b.reduce_sum(powered, (1,), keepdims=True))


def row_reduce_consumers(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    x = b.parameter("x", shape, dtype)
    b.output("y", (x - b.reduce_mean(x, (1,), keepdims=True)) * b.parameter("scale", (shape[1],), dtype))


def bert_layernorm_residual(b: GraphBuilder, shape: tuple[int, ...], dtype: str) -> None:
    cols = shape[1]
    h = _compute(b, b.parameter("x", shape, dtype) + b.parameter("residual", shape, dtype))
    y = _layernorm(b, h, b.parameter("gamma", (cols,)), b.parameter("beta", (cols,)))
    b.output("y", b.cast(y, dtype))


_LN_SHAPES = ((128, 768), (4096, 1024), (16384, 4096), (8192, 12288))
_SOFTMAX_SHAPES = (*((4096, 256 << i) for i in range(8)), (16384, 131072))
_RC = ("rows", "cols")

CASES: dict[str, Case] = {
    c.name: c
    for c in (
        Case("layernorm_fwd", layernorm_fwd, "rows*cols*2*isz + 2*cols*4", _RC, _LN_SHAPES, ("f32", "f16")),
        Case("layernorm_bwd", layernorm_bwd, "rows*cols*3*isz + 2*rows*4 + 3*cols*4", _RC, _LN_SHAPES, ("f32", "f16")),
        Case(
            "rmsnorm_fwd", rmsnorm_fwd, "rows*cols*2*isz + cols*4", _RC, ((4096, 4096), (8192, 8192)), ("f32", "bf16")
        ),
        Case(
            "rmsnorm_bwd",
            rmsnorm_bwd,
            "rows*cols*3*isz + rows*4 + 2*cols*4",
            _RC,
            ((4096, 4096), (8192, 8192)),
            ("f32", "bf16"),
        ),
        Case("softmax_fwd", softmax_fwd, "rows*cols*2*isz", _RC, _SOFTMAX_SHAPES, ("f32", "f16")),
        Case("softmax_bwd", softmax_bwd, "rows*cols*3*isz", _RC, _SOFTMAX_SHAPES, ("f32", "f16")),
        Case(
            "attention_softmax",
            attention_softmax,
            "batch*heads*seq*seq*2*isz + batch*seq*4",
            ("batch", "heads", "seq", "seq_k"),
            ((8, 12, 512, 512), (32, 16, 128, 128)),
            ("f16",),
        ),
        Case(
            "bias_gelu_fwd",
            bias_gelu_fwd,
            "rows*cols*2*isz + cols*4",
            _RC,
            ((4096, 3072), (16384, 4096)),
            ("f32", "f16"),
        ),
        Case(
            "gelu_bwd_bias_grad",
            gelu_bwd_bias_grad,
            "rows*cols*3*isz + 2*cols*4",
            _RC,
            ((4096, 3072), (16384, 4096)),
            ("f32", "f16"),
        ),
        Case(
            "dropout_residual_layernorm",
            dropout_residual_layernorm,
            "rows*cols*(4*isz + 1) + 2*cols*4",
            _RC,
            ((4096, 1024),),
            ("f32",),
        ),
        Case(
            "cross_entropy_fwd",
            cross_entropy_fwd,
            "rows*cols*2*isz + isz",
            _RC,
            ((8192, 30522), (4096, 50257)),
            ("f32",),
        ),
        Case("astitch_fig7", astitch_fig7, "rows*cols*3*isz", _RC, ((2, 128), (4096, 1024)), ("f32",)),
        Case("many_short_rows", row_reduce_consumers, "rows*cols*2*isz + cols*isz", _RC, ((750000, 32),), ("f32",)),
        Case("few_long_rows", row_reduce_consumers, "rows*cols*2*isz + cols*isz", _RC, ((64, 30000),), ("f32",)),
        Case(
            "bert_layernorm_residual",
            bert_layernorm_residual,
            "rows*cols*3*isz + 2*cols*4",
            _RC,
            ((128, 768),),
            ("f16",),
        ),
    )
}


def io_bytes(graph: Graph) -> int:
    """Unique input bytes plus output bytes, from the graph itself (bf16 counts 2 bytes)."""
    inputs = sum(math.prod(p.shape) * p.dtype.itemsize for p in graph.parameters)
    outputs = {node_id for _, node_id in graph.outputs}
    return inputs + sum(math.prod(graph.node(n).shape) * graph.node(n).dtype.itemsize for n in outputs)


def build_case(name: str, shape: Sequence[int], dtype: str) -> Graph:
    """One case at one shape and dtype, with its metadata."""
    if name not in CASES:
        raise ValueError(f"unknown suite case {name!r} (known: {', '.join(CASES)})")
    case = CASES[name]
    if len(shape) != len(case.sizes):
        raise ValueError(f"case {name!r} takes a shape of {len(case.sizes)} sizes ({', '.join(case.sizes)})")
    builder = GraphBuilder()
    case.build(builder, tuple(shape), dtype)
    graph = builder.build()
    return graph.with_metadata(
        case=name,
        shape=tuple(shape),
        dtype=dtype,
        sizes=tuple(zip(case.sizes, shape, strict=True)),
        io_bytes=io_bytes(graph),
        io_bytes_formula=case.formula,
        io_bytes_isz=DType.parse(dtype).itemsize,
    )


def file_name(name: str, shape: Sequence[int], dtype: str) -> str:
    return f"{name}_{'x'.join(str(d) for d in shape)}_{dtype}.json"


def write_suite(out: Path) -> list[Path]:
    """Every case at every listed shape and dtype, one JSON file each."""
    written = []
    for case in CASES.values():
        for shape in case.shapes:
            for dtype in case.dtypes:
                written.append(save(build_case(case.name, shape, dtype), out / file_name(case.name, shape, dtype)))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/suite"), help="directory for the JSON files")
    args = parser.parse_args(argv)
    written = write_suite(args.out)
    print(f"wrote {len(written)} graphs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
