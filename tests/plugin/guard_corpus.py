"""A catalogue of subtle kernel faults and the guard's record on real clusters (not a test module).

Each fault turns a correct stitched result into a wrong one the way a kernel bug would: at the
outputs (a 1% scale, a bias of 1% of the RMS, one element doubled, one row zeroed, every element
read one place off), in the kernel's loads (one element of the input of the cluster's longest
reduction never read: a term dropped from a long sum), or in the compiled graph (every small
constant of the cluster 100x: a wrong epsilon in a normalisation; a vector broadcast read along
the wrong output axis). The kernel under test is the
real cpu backend; "TF's result" is numpy's unfused float32 evaluation, the reference float64.
A fault that leaves an output unchanged (a zero scaled, a constant row rolled) is counted as not
applicable, never as caught.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Attrs, Graph, Node, Op, load
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import CpuBackend, CpuOptions
from stitchfleet.compiler.tolerance import error_floor, roundoff, scaled_error
from stitchfleet.plugin.guard import numeric

WORKLOADS = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads"
MODELS = ("bert_encoder", "transformer_block", "dien_attention_gru", "crnn_head")
FACTOR = 8.0
Array = np.ndarray[Any, Any]
OUTPUT_FAULTS = ("scale_1pct", "bias_1pct_rms", "element_doubled", "row_zeroed", "off_by_one")
FAULTS = (*OUTPUT_FAULTS, "term_dropped", "wrong_epsilon", "wrong_broadcast_axis")


@dataclass
class Cluster:
    """One workload cluster compiled for the cpu backend."""

    name: str
    graph: Graph
    run: Callable[[dict[str, Array]], dict[str, Array]]

    @property
    def outputs(self) -> list[str]:
        return [name for name, _ in self.graph.outputs]

    @property
    def parameters(self) -> list[str]:
        return [str(p.attrs["name"]) for p in self.graph.parameters]


def compile_cluster(graph: Graph, cache: Path, name: str) -> Cluster:
    executable = CpuBackend(CpuOptions(cache_dir=cache)).compile_graph(graph, plan_cluster(graph, 0, PlanOptions()))
    return Cluster(name, graph, executable)


def workload_clusters(model: str, cache: Path) -> Iterator[Cluster]:
    for path in sorted((WORKLOADS / model).glob("cluster_*.json")):
        yield compile_cluster(load(path), cache, f"{model}/{path.stem}")


@dataclass
class Step:
    """One check step's inputs, TF's result (numpy's unfused float32) and the fp64 reference."""

    inputs: dict[str, Array]
    tf_like: dict[str, Array]
    reference: dict[str, Array]

    @classmethod
    def of(cls, graph: Graph, seed: int) -> Step:
        inputs = random_inputs(graph, seed)
        return cls(inputs, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))


def judge(cluster: Cluster, step: Step, stitched: dict[str, Array]) -> numeric.Finding:
    return numeric.judge(
        cluster.graph,
        [step.inputs[n] for n in cluster.parameters],
        [np.asarray(step.tf_like[n]) for n in cluster.outputs],
        [np.asarray(stitched[n]) for n in cluster.outputs],
        FACTOR,
        reference=step.reference,
    )


def effect(clean: dict[str, Array], faulty: dict[str, Array]) -> float:
    """How far a fault moved the outputs: the largest scaled difference (the rule's distance) from the clean run."""
    worst = 0.0
    for name, value in clean.items():
        base = np.asarray(value, dtype=np.float64)
        if np.asarray(value).dtype.kind == "f" and base.size:
            floor = error_floor(base, numeric.FLOOR_RATIO)
            worst = max(worst, scaled_error(np.asarray(faulty[name]), base, floor))
    return worst


def _rms(value: Array) -> float:
    return float(np.sqrt(np.mean(np.square(value.astype(np.float64))))) if value.size else 0.0


def corrupt_output(kind: str, value: Array, rng: np.random.Generator) -> Array | None:
    """`value` as the faulty kernel returns it, or None when this fault cannot change this output."""
    wrong = value.copy()
    flat = wrong.reshape(-1)
    rms = _rms(value)
    if rms == 0.0 or not np.isfinite(rms):
        return None
    if kind == "scale_1pct":
        flat *= flat.dtype.type(1.01)
    elif kind == "bias_1pct_rms":
        flat += flat.dtype.type(0.01 * rms)
    elif kind == "element_doubled":
        big = np.flatnonzero(np.abs(flat) >= rms / 10)
        flat[rng.choice(big)] *= 2
    elif kind == "row_zeroed":
        rows = wrong.reshape(-1, wrong.shape[-1]) if wrong.ndim else wrong.reshape(1, 1)
        live = [i for i in range(rows.shape[0]) if _rms(rows[i]) >= rms / 10]
        rows[rng.choice(live)] = 0
    elif kind == "off_by_one":
        flat[:] = np.roll(value.reshape(-1), 1)
    else:
        raise ValueError(f"unknown output fault {kind!r}")
    return None if np.array_equal(wrong, value) else wrong


def dropped_term_inputs(
    cluster: Cluster, inputs: dict[str, Array], rng: np.random.Generator
) -> dict[str, Array] | None:
    """The inputs with one element of the parameter feeding the longest reduction zeroed (a skipped load)."""
    graph = cluster.graph
    reductions = [n for n in graph.nodes if n.op.name.startswith("REDUCE") and n.inputs]
    if not reductions:
        return None
    longest = max(
        reductions, key=lambda n: int(np.prod(graph.node(n.inputs[0]).shape)) // max(int(np.prod(n.shape)), 1)
    )
    feeding = _parameters_upstream(graph, longest.inputs[0])
    floats = [
        p for p in feeding if np.issubdtype(np.asarray(inputs[p]).dtype, np.floating) and np.asarray(inputs[p]).size > 1
    ]
    if not floats:
        return None
    name = floats[0]
    value = np.array(inputs[name])
    value.reshape(-1)[rng.integers(value.size)] = 0
    return {**inputs, name: value}


def _parameters_upstream(graph: Graph, node_id: int) -> list[str]:
    seen, todo, found = set(), [node_id], []
    while todo:
        node = graph.node(todo.pop())
        if node.id in seen:
            continue
        seen.add(node.id)
        if node.op is Op.PARAMETER:
            found.append(str(node.attrs["name"]))
        todo.extend(node.inputs)
    return sorted(found)


def wrong_epsilon(graph: Graph) -> Graph | None:
    """Every small positive float constant (an epsilon, 0 < c < 1e-3) 100x larger; None without one."""
    nodes, changed = [], False
    for node in graph.nodes:
        values = np.asarray(node.attrs.get("value", ()), dtype=np.float64) if node.op is Op.CONSTANT else np.zeros(0)
        if node.dtype.is_float and values.size and np.all((values > 0) & (values < 1e-3)):
            wrong = values * 100
            value = tuple(wrong.tolist()) if wrong.ndim else float(wrong)
            nodes.append(dataclasses.replace(node, attrs=Attrs({**dict(node.attrs), "value": value})))
            changed = True
        else:
            nodes.append(node)
    return dataclasses.replace(graph, nodes=tuple(nodes)) if changed else None


def wrong_broadcast_axis(graph: Graph) -> Graph | None:
    """The first BROADCAST of a vector (a bias, a scale, a mask row) reads it along another output axis,
    as a kernel indexing it with the wrong loop variable would: element [.., i, .., j, ..] gets
    x[i mod k] instead of x[j]. A same-length axis is a pure mix-up; a different length wraps (the
    vector tiled, then cut to that axis). The output shape is unchanged; None without such a BROADCAST."""
    for position, node in enumerate(graph.nodes):
        if node.op is not Op.BROADCAST or len(graph.node(node.inputs[0]).shape) != 1:
            continue
        (axis,), length = node.attrs.get_ints("dims"), graph.node(node.inputs[0]).shape[0]
        others = [b for b, size in enumerate(node.shape) if b != axis and size > 1]
        if length > 1 and others:
            return _spread_along(graph, position, others[0])
    return None


def _spread_along(graph: Graph, position: int, axis: int) -> Graph:
    """`graph` with the vector BROADCAST at `position` spread along output `axis` (tiled to its length)."""
    node = graph.node(position)
    source = graph.node(node.inputs[0])
    length, target = source.shape[0], node.shape[axis]
    made: list[Node] = []

    def add(op: Op, inputs: tuple[int, ...], shape: tuple[int, ...], attrs: dict[str, object]) -> int:
        made.append(Node(position + len(made), op, inputs, shape, source.dtype, f"{node.name}_wrong", Attrs(attrs)))
        return made[-1].id

    copies = -(-target // length)
    tiled = add(Op.CONCAT, (source.id,) * copies, (length * copies,), {"axis": 0}) if copies > 1 else source.id
    cut = add(Op.SLICE, (tiled,), (target,), {"begin": (0,), "end": (target,), "strides": (1,)})
    shift = len(made)
    moved = [
        dataclasses.replace(n, id=n.id + shift, inputs=tuple(i + shift if i >= position else i for i in n.inputs))
        for n in graph.nodes[position:]
    ]
    moved[0] = dataclasses.replace(moved[0], inputs=(cut,), attrs=Attrs({**dict(node.attrs), "dims": (axis,)}))
    outputs = {name: i + shift if i >= position else i for name, i in graph.outputs}
    return Graph.create([*graph.nodes[:position], *made, *moved], outputs, dict(graph.metadata))


@dataclass
class Record:
    """Caught / applicable per fault kind, the faults below fp32 noise, and where a fault was missed."""

    caught: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    applicable: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    below_noise: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    missed: list[str] = dataclasses.field(default_factory=list)

    def add(self, kind: str, where: str, moved: float, finding: numeric.Finding) -> None:
        """One faulty run; `moved` is the fault's effect (a fault that moved nothing beyond fp32 rounding,
        FACTOR units of roundoff, is no fault a guard could see: counted apart, never as caught)."""
        if moved <= FACTOR * roundoff(np.dtype(np.float32)):
            self.below_noise[kind] += 1
            return
        self.applicable[kind] += 1
        if finding.ok:
            self.missed.append(
                f"{kind} {where}: moved {moved:.3g}, error {finding.compiled_error:.3g} <= {finding.allowed:.3g}"
            )
        else:
            self.caught[kind] += 1


def run_corpus(cluster: Cluster, cache: Path, record: Record, seed: int = 0) -> None:
    """Every fault of the catalogue on `cluster` (each float output for the output faults)."""
    rng = np.random.default_rng(seed)
    step = Step.of(cluster.graph, seed)
    clean = cluster.run(step.inputs)
    faulty: dict[str, Array]
    for kind in OUTPUT_FAULTS:
        for name in cluster.outputs:
            value = np.asarray(clean[name])
            wrong = corrupt_output(kind, value, rng) if value.dtype.kind == "f" else None
            if wrong is not None:
                faulty = {**clean, name: wrong}
                record.add(kind, f"{cluster.name}:{name}", effect(clean, faulty), judge(cluster, step, faulty))
    dropped = dropped_term_inputs(cluster, step.inputs, rng)
    if dropped is not None:
        faulty = cluster.run(dropped)
        record.add("term_dropped", cluster.name, effect(clean, faulty), judge(cluster, step, faulty))
    mutated = wrong_epsilon(cluster.graph)
    if mutated is not None:
        faulty = compile_cluster(mutated, cache, cluster.name).run(step.inputs)
        record.add("wrong_epsilon", cluster.name, effect(clean, faulty), judge(cluster, step, faulty))
    spread = wrong_broadcast_axis(cluster.graph)
    if spread is not None:
        faulty = compile_cluster(spread, cache, cluster.name).run(step.inputs)
        record.add("wrong_broadcast_axis", cluster.name, effect(clean, faulty), judge(cluster, step, faulty))


def clean_ratio(cluster: Cluster, seed: int) -> float:
    """A correct run's worst error as a share of what the fp64 rule allows (a false reject when > 1).

    Judged without the fast path (which accepts results within a few ulp of TF's without fp64): the
    share says how close a correct kernel comes to being rejected, not to needing the fp64 reference."""
    step = Step.of(cluster.graph, seed)
    stitched = cluster.run(step.inputs)
    if not judge(cluster, step, stitched).ok:
        return float("inf")
    finding = numeric.judge_with_reference(
        cluster.graph,
        [np.asarray(step.tf_like[n]) for n in cluster.outputs],
        [np.asarray(stitched[n]) for n in cluster.outputs],
        step.reference,
        FACTOR,
    )
    if not finding.ok:
        return float("inf")
    return finding.compiled_error / finding.allowed if finding.allowed > 0 else 0.0
