"""CPU figures (not tests): stitched `cpu` code vs plain TensorFlow CPU running the same cluster.

Input: the workload clusters in benchmarks/workloads/*/cluster_*.json and the suite cases
at CPU-sized shapes. Output: a table on stdout and benchmarks/results/cpu-<date>.json/.md,
labelled with the CPU model and core count. TF runs the cluster op by op as a
`tf.function` (graph mode, no XLA: what a training step without stitching does), built
from the IR by the small translator below (TF lives only in this script and the plugin).
Same process, same inputs, warm-up, then interleaved runs; medians are reported.

    PYTHONPATH=. python scripts/bench_cpu.py [--reps 30] [--only bert_encoder]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.suite import build_case  # noqa: E402
from stitchfleet.compiler.evaluate import random_inputs  # noqa: E402
from stitchfleet.compiler.ir import DType, Graph, Node, Op, load  # noqa: E402
from stitchfleet.compiler.runtime.cpu import compile_cluster, cpu_model  # noqa: E402
from stitchfleet.compiler.scope import find_clusters  # noqa: E402
from stitchfleet.compiler.subgraph import extract  # noqa: E402

SUITE_CPU = {
    "layernorm_fwd": ((4096, 1024), "f32"),
    "layernorm_bwd": ((4096, 1024), "f32"),
    "rmsnorm_fwd": ((4096, 1024), "f32"),
    "softmax_fwd": ((4096, 1024), "f32"),
    "softmax_bwd": ((4096, 1024), "f32"),
    "bias_gelu_fwd": ((4096, 1024), "f32"),
    "gelu_bwd_bias_grad": ((4096, 1024), "f32"),
    "dropout_residual_layernorm": ((4096, 1024), "f32"),
    "cross_entropy_fwd": ((512, 8192), "f32"),
    "astitch_fig7": ((4096, 1024), "f32"),
}


def _tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def _tf_dtype(tf: Any, dtype: DType) -> Any:
    names = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i32": "int32"}
    return getattr(tf, {**names, "i64": "int64", "bool": "bool"}[dtype.value])


def _tf_op(tf: Any, node: Node, args: list[Any]) -> Any:
    unary: dict[Op, Callable[[Any], Any]] = {
        Op.NEG: tf.negative,
        Op.ABS: tf.abs,
        Op.SQUARE: tf.square,
        Op.RELU: tf.nn.relu,
        Op.LOGICAL_NOT: tf.logical_not,
        Op.SIGN: tf.sign,
        Op.FLOOR: tf.floor,
        Op.CEIL: tf.math.ceil,
        Op.EXP: tf.exp,
        Op.LOG: tf.math.log,
        Op.LOG1P: tf.math.log1p,
        Op.TANH: tf.tanh,
        Op.SIGMOID: tf.sigmoid,
        Op.ERF: tf.math.erf,
        Op.RSQRT: tf.math.rsqrt,
        Op.SQRT: tf.sqrt,
        Op.RECIPROCAL: tf.math.reciprocal,
    }
    binary: dict[Op, Callable[[Any, Any], Any]] = {
        Op.ADD: tf.add,
        Op.SUB: tf.subtract,
        Op.MUL: tf.multiply,
        Op.DIV: tf.math.truediv,
        Op.POW: tf.pow,
        Op.MAXIMUM: tf.maximum,
        Op.MINIMUM: tf.minimum,
        Op.GREATER: tf.greater,
        Op.GREATER_EQUAL: tf.greater_equal,
        Op.LESS: tf.less,
        Op.LESS_EQUAL: tf.less_equal,
        Op.EQUAL: tf.equal,
        Op.NOT_EQUAL: tf.not_equal,
        Op.LOGICAL_AND: tf.logical_and,
        Op.LOGICAL_OR: tf.logical_or,
    }
    reduce = {
        Op.REDUCE_SUM: tf.reduce_sum,
        Op.REDUCE_MAX: tf.reduce_max,
        Op.REDUCE_MIN: tf.reduce_min,
        Op.REDUCE_MEAN: tf.reduce_mean,
        Op.REDUCE_PROD: tf.reduce_prod,
    }
    a = node.attrs
    if node.op in unary:
        return unary[node.op](args[0])
    if node.op in binary:
        return binary[node.op](args[0], args[1])
    if node.op in reduce:
        return reduce[node.op](args[0], axis=list(a.get_ints("axes")))
    if node.op is Op.BROADCAST:
        expanded = [1] * len(node.shape)
        operand_shape = args[0].shape
        for i, d in enumerate(a.get_ints("dims")):
            expanded[d] = operand_shape[i]
        return tf.broadcast_to(tf.reshape(args[0], expanded), node.shape)
    other: dict[Op, Callable[[], Any]] = {
        Op.CAST: lambda: tf.cast(args[0], _tf_dtype(tf, node.dtype)),
        Op.SELECT: lambda: tf.where(args[0], args[1], args[2]),
        Op.RESHAPE: lambda: tf.reshape(args[0], node.shape),
        Op.TRANSPOSE: lambda: tf.transpose(args[0], a.get_ints("perm")),
        Op.SLICE: lambda: tf.strided_slice(args[0], a.get_ints("begin"), a.get_ints("end"), a.get_ints("strides")),
        Op.CONCAT: lambda: tf.concat(args, a.get_int("axis")),
        Op.CONSTANT: lambda: tf.constant(
            np.asarray(a["value"], dtype=np.float64).reshape(node.shape), _tf_dtype(tf, node.dtype)
        ),
    }
    return other[node.op]()


def tf_function(tf: Any, graph: Graph) -> Callable[[list[Any]], Any]:
    """The cluster as a tf.function of its parameters (in graph.parameters order)."""

    def body(*params: Any) -> list[Any]:
        values: list[Any] = []
        given = iter(params)
        for node in graph.nodes:
            values.append(
                next(given) if node.op is Op.PARAMETER else _tf_op(tf, node, [values[i] for i in node.inputs])
            )
        return [values[n] for _, n in graph.outputs]

    return tf.function(body)  # type: ignore[no-any-return]


def _tf_inputs(tf: Any, graph: Graph, inputs: dict[str, np.ndarray]) -> list[Any]:
    return [tf.constant(inputs[str(p.attrs["name"])], _tf_dtype(tf, p.dtype)) for p in graph.parameters]


def measure(tf: Any, graph: Graph, cache: Path, reps: int) -> dict[str, Any]:
    inputs = random_inputs(graph, 0)
    stitched = compile_cluster(graph, cache)
    fn = tf_function(tf, graph)
    tf_args = _tf_inputs(tf, graph, inputs)
    for _ in range(3):
        stitched(inputs)
        [o.numpy() for o in fn(*tf_args)]
    ours, theirs = [], []
    for _ in range(reps):
        t = time.perf_counter()
        stitched(inputs)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        [o.numpy() for o in fn(*tf_args)]  # .numpy(): TF's result in host memory, like ours
        theirs.append(time.perf_counter() - t)
    cpu_ms, tf_ms = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
    elements = sum(math.prod(n.shape) for n in graph.nodes if n.op is not Op.CONSTANT)
    ops = sum(1 for n in graph.nodes if n.op.is_memory_intensive and n.op is not Op.CONSTANT)
    return {"cpu_ms": cpu_ms, "tf_ms": tf_ms, "speedup": tf_ms / cpu_ms, "ops": ops, "elements": elements}


def _cases(only: str | None) -> list[tuple[str, Graph]]:
    out: list[tuple[str, Graph]] = []
    for path in sorted((ROOT / "benchmarks" / "workloads").glob("*/cluster_*.json")):
        if only is None or only in str(path):
            out.append((f"{path.parent.name}/{path.stem}", load(path)))
    for name, (shape, dtype) in SUITE_CPU.items():
        if only is None or only in f"suite/{name}":
            graph = build_case(name, shape, dtype)
            for i, c in enumerate(find_clusters(graph, 8).clusters):
                out.append((f"suite/{name}_{'x'.join(map(str, shape))}_{dtype}#{i}", extract(graph, c.nodes)))
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["case"].split("/")[0], []).append(r)
    return {
        g: {
            "clusters": len(rs),
            "cpu_ms_total": sum(r["cpu_ms"] for r in rs),
            "tf_ms_total": sum(r["tf_ms"] for r in rs),
            "speedup_total": sum(r["tf_ms"] for r in rs) / sum(r["cpu_ms"] for r in rs),
            "speedup_geomean": math.exp(statistics.mean(math.log(r["speedup"]) for r in rs)),
        }
        for g, rs in groups.items()
    }


def _markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# CPU figures ({doc['date']})",
        "",
        f"CPU: {doc['cpu']}, **{doc['cores']} cores** (OpenMP uses all of them; TF's intra-op pool too).",
        "Stitched `cpu` backend (C + OpenMP, gcc -O3 -march=native, no fast-math) vs plain TensorFlow "
        f"{doc['tf_version']} CPU running the same cluster op by op (tf.function, no XLA). Medians of "
        f"{doc['reps']} interleaved runs after warm-up, same process, same inputs. These are CPU figures, "
        "not GPU ones.",
        "",
        "| group | clusters | stitched ms (sum) | TF ms (sum) | speedup (sum) | speedup (geomean) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for g, s in doc["summary"].items():
        lines.append(
            f"| {g} | {s['clusters']} | {s['cpu_ms_total']:.2f} | {s['tf_ms_total']:.2f} | "
            f"{s['speedup_total']:.2f}x | {s['speedup_geomean']:.2f}x |"
        )
    lines += ["", "| cluster | MI ops | elements | stitched ms | TF ms | speedup |", "|---|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(
            f"| {r['case']} | {r['ops']} | {r['elements']} | {r['cpu_ms']:.3f} | {r['tf_ms']:.3f} "
            f"| {r['speedup']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--only", default=None, help="only cases whose name contains this")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    tf = _tf()
    cache = Path(tempfile.gettempdir()) / "stitchfleet-bench-cpu"
    rows = []
    print(f"{'cluster':<56} {'ops':>4} {'stitched ms':>12} {'TF ms':>9} {'speedup':>8}")
    for name, graph in _cases(args.only):
        row = {"case": name, **measure(tf, graph, cache, args.reps)}
        rows.append(row)
        print(f"{name:<56} {row['ops']:>4} {row['cpu_ms']:>12.3f} {row['tf_ms']:>9.3f} {row['speedup']:>7.2f}x")
    date = datetime.date.today().isoformat()
    doc = {
        "date": date,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "tf_version": tf.__version__,
        "reps": args.reps,
        "summary": _summary(rows),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"cpu-{date}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / f"cpu-{date}.md").write_text(_markdown(doc))
    for g, s in doc["summary"].items():
        print(f"{g}: {s['clusters']} clusters, {s['speedup_total']:.2f}x total, {s['speedup_geomean']:.2f}x geomean")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
