"""The IR -> jax.numpy and IR -> torch translators agree with `evaluate` on every op the suite and workloads use."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.harness.cases import suite_cases, workload_cases
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import DType, Graph, GraphBuilder, Op
from stitchfleet.compiler.tolerance import check_outputs, scaled_error

jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax jaxlib; the GPU image has it)")
torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch; the GPU image has it)")

from benchmarks.harness import translate_jax, translate_torch  # noqa: E402

SUITE = {c.name: c.graph for c in suite_cases(tiny=True)}
WORKLOADS = {c.name: c.graph for c in workload_cases()}


def _bf16_outputs(graph: Graph) -> frozenset[str]:
    return frozenset(n for n, i in graph.outputs if graph.node(i).dtype is DType.BF16)


def _references(graph: Graph, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    inputs = random_inputs(graph, seed)
    return evaluate(graph, inputs), evaluate(graph, inputs, "float64")


def _judge(graph: Graph, got: dict[str, np.ndarray], seed: int, factor: float = 8.0, refs: tuple | None = None) -> None:
    native, reference = refs or _references(graph, seed)
    verdicts = check_outputs(got, native, reference, factor=factor, bf16_outputs=_bf16_outputs(graph))
    assert all(v.ok for v in verdicts.values()), {n: v.reason for n, v in verdicts.items() if not v.ok}


def _run_jax(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    fn = jax.jit(translate_jax.to_jax(graph))
    out = fn(random_inputs(graph, seed))
    return {n: np.asarray(v.astype("float32") if v.dtype == "bfloat16" else v) for n, v in out.items()}


def _torch_inputs(graph: Graph, seed: int, precision: str = "native") -> dict[str, object]:
    dtypes = {str(p.attrs["name"]): translate_torch.dtype_of(p.dtype) for p in graph.parameters}
    return {n: torch.from_numpy(np.asarray(v)).to(dtypes[n]) for n, v in random_inputs(graph, seed).items()}


def _run_torch(graph: Graph, seed: int, precision: str = "native") -> dict[str, np.ndarray]:
    out = translate_torch.to_torch(graph, precision)(_torch_inputs(graph, seed))
    return {n: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for n, v in out.items()}


def _every_op_graph() -> Graph:
    """The ops no suite case or workload uses, each once, with ints, bools and strided slices."""
    b = GraphBuilder()
    x, y = b.parameter("x", (6, 8)), b.parameter("y", (6, 8))
    n = b.parameter("n", (6, 8), "i32")
    flag = b.binary(Op.LESS, x, y)
    both = b.binary(Op.LOGICAL_AND, flag, b.unary(Op.LOGICAL_NOT, b.binary(Op.EQUAL, x, y)))
    either = b.binary(Op.LOGICAL_OR, both, b.binary(Op.LESS_EQUAL, y, x))
    picked = b.select(b.binary(Op.NOT_EQUAL, either, b.binary(Op.GREATER, x, y)), x, y)
    rounded = b.unary(Op.FLOOR, x) + b.unary(Op.CEIL, y) + b.unary(Op.SIGN, x) * b.unary(Op.ABS, y)
    mixed = b.maximum(picked, rounded) - b.minimum(x, y) + b.unary(Op.RECIPROCAL, b.square(y) + 1.0)
    b.output("mixed", mixed)
    b.output("prod", b.reduce(Op.REDUCE_PROD, b.unary(Op.SIGMOID, x) + 0.5, (1,)))
    b.output("low", b.reduce(Op.REDUCE_MIN, b.transpose(mixed, (1, 0)), (0,)))
    b.output("cat", b.concat([b.slice(x, (0, 1), (6, 8), (2, 3)), b.slice(y, (1, 0), (4, 3))], 0))
    b.output("ints", b.binary(Op.MAXIMUM, n * n - n, n))
    b.output("log1p", b.unary(Op.LOG1P, b.unary(Op.RELU, x)) + b.log(b.square(y) + 1.0) + b.tanh(x))
    b.output("half", b.cast(b.cast(x, "f16") * b.cast(y, "f16"), "f32") + b.cast(b.cast(x, "bf16"), "f32"))
    return b.build()


def test_every_ir_op_is_translated() -> None:
    graph = _every_op_graph()
    used = {n.op for n in graph.nodes} | {n.op for g in (*SUITE.values(), *WORKLOADS.values()) for n in g.nodes}
    assert used == set(Op) - {Op.OPAQUE}
    _judge(graph, _run_jax(graph, 3), 3)
    _judge(graph, _run_torch(graph, 3), 3)


@pytest.mark.parametrize("name", sorted(SUITE))
def test_suite_case_through_jax_jit(name: str) -> None:
    _judge(SUITE[name], _run_jax(SUITE[name], 1), 1)


@pytest.mark.parametrize("name", sorted(SUITE))
def test_suite_case_through_torch(name: str) -> None:
    _judge(SUITE[name], _run_torch(SUITE[name], 1), 1)


@pytest.mark.parametrize("name", sorted(SUITE)[::4])
def test_torch_float64_precision_is_the_fp64_reference(name: str) -> None:
    graph = SUITE[name]
    inputs = random_inputs(graph, 2)
    reference = evaluate(graph, inputs, "float64")
    got = translate_torch.to_torch(graph, "float64")(_torch_inputs(graph, 2))
    for out, value in got.items():
        assert value.dtype in (torch.float64, torch.bool, torch.int32, torch.int64)
        np.testing.assert_allclose(value.numpy(), reference[out], rtol=1e-9, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert_encoder", "transformer_block", "dien_attention_gru", "crnn_head"])
def test_workload_clusters_through_both(model: str) -> None:
    """Same meaning everywhere: float64 matches evaluate's float64 to rounding (scaled as the guard does).

    Native results get a looser factor than our kernels: XLA and torch reorder f32 arithmetic,
    and random inputs to optimizer updates (negative 'variances', cancellations) amplify that
    in a few outputs (seen up to 45x numpy's error in transformer_block cluster 08).
    """
    names = sorted(n for n in WORKLOADS if n.startswith(model + "/"))
    assert names
    for i, name in enumerate(names):
        graph = WORKLOADS[name]
        refs = _references(graph, i)
        _judge(graph, _run_jax(graph, i), i, factor=64.0, refs=refs)
        _judge(graph, _run_torch(graph, i), i, factor=64.0, refs=refs)
        reference = refs[1]
        for out, value in translate_torch.to_torch(graph, "float64")(_torch_inputs(graph, i)).items():
            ref = np.asarray(reference[out], np.float64)
            floor = 1e-3 * float(np.sqrt(np.mean(np.square(ref[np.isfinite(ref)])))) + 1e-300
            assert scaled_error(value.double().numpy(), ref, floor) < 1e-9, (name, out)


def test_opaque_ops_are_refused_by_name() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (2, 2))
    b.output("y", b.opaque("MatMul", [x, x], (2, 2), "f32", "compute-intensive"))
    graph = b.build()
    with pytest.raises(translate_torch.TranslationError, match="OPAQUE"):
        translate_torch.to_torch(graph)
    with pytest.raises(translate_jax.TranslationError, match="OPAQUE"):
        translate_jax.to_jax(graph)
