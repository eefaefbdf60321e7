"""What we launch for one benchmark graph: our stitched kernels, and our own per_op baseline.

Input: a standalone cluster graph (a suite case or a workload cluster) and a planner
device profile. Output: a `Program`: steps in launch order, each the kernel IR of one
lowered plan plus which value every buffer binds to. Values are named `in:<param>`
(graph inputs), `v<id>` (per_op intermediates and results) and `out:<name>`; a
runner (sim or cuda) allocates them and runs the steps.

- stitch: the cluster as one plan (`plan_cluster` + `lower`), as the compiler runs it.
- per_op: one plan per op, through the same planner and lowering, so its kernels are
  the same code generator's, only unfused. An op's kernel inlines the ops that launch
  nothing in TensorFlow (CONSTANT, RESHAPE, BROADCAST: TF's element-wise kernels
  broadcast their operands) between it and the values it reads, as
  `stitchfleet.compiler.baselines.per_op` counts; such an op gets a kernel of its own
  only when its value is a graph output (it must be written somewhere).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stitchfleet.compiler.ir import Attrs, DType, Graph, Node, Op, Shape
from stitchfleet.compiler.kernel.ir import Kernel
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster

_FREE = frozenset({Op.CONSTANT, Op.RESHAPE, Op.BROADCAST})


@dataclass(frozen=True)
class Step:
    kernels: tuple[Kernel, ...]
    inputs: tuple[tuple[str, str], ...]  # (buffer name, value name)
    outputs: tuple[tuple[str, str], ...]  # (buffer name, value name)


@dataclass(frozen=True)
class Program:
    name: str
    steps: tuple[Step, ...]
    values: dict[str, tuple[Shape, DType]]  # every value a step reads or writes
    outputs: tuple[tuple[str, str], ...]  # (graph output name, value name)

    @property
    def kernel_count(self) -> int:
        return sum(len(s.kernels) for s in self.steps)


def _param_values(graph: Graph) -> dict[str, tuple[Shape, DType]]:
    return {f"in:{p.attrs['name']}": (p.shape, p.dtype) for p in graph.parameters}


def stitch_program(graph: Graph, profile: str = "h200") -> Program:
    """The whole cluster through the stitch planner: the kernels the plugin would launch."""
    lowered = lower(graph, plan_cluster(graph, 0, PlanOptions(profile)))
    shapes = {name: graph.node(i) for name, i in graph.outputs}
    values = _param_values(graph) | {f"out:{n}": (node.shape, node.dtype) for n, node in shapes.items()}
    step = Step(
        lowered.kernels,
        tuple((buf, f"in:{name}") for name, buf in lowered.inputs),
        tuple((buf, f"out:{name}") for name, buf in lowered.outputs),
    )
    return Program("stitch", (step,), values, tuple((n, f"out:{n}") for n, _ in graph.outputs))


def _value_name(graph: Graph, node_id: int) -> str:
    node = graph.node(node_id)
    return f"in:{node.attrs['name']}" if node.op is Op.PARAMETER else f"v{node_id}"


def _inlined(graph: Graph, root: int) -> tuple[list[int], list[int]]:
    """(members, external inputs) of `root`'s kernel: root plus the free ops between it and real values."""
    members, inputs, stack = {root}, set(), [root]
    while stack:
        for source in graph.node(stack.pop()).inputs:
            node = graph.node(source)
            if node.op in _FREE and source not in members:
                members.add(source)
                stack.append(source)
            elif node.op not in _FREE:
                inputs.add(source)
    return sorted(members), sorted(inputs)


def op_graph(graph: Graph, root: int) -> tuple[Graph, list[int]]:
    """One op (with its inlined free producers) as a standalone graph whose only output is the op's value."""
    members, inputs = _inlined(graph, root)
    nodes: list[Node] = []
    new_id: dict[int, int] = {}
    for source in inputs:
        origin = graph.node(source)
        new_id[source] = len(nodes)
        nodes.append(
            Node(len(nodes), Op.PARAMETER, (), origin.shape, origin.dtype, f"a{source}", Attrs(name=f"a{source}"))
        )
    for member in members:
        node = graph.node(member)
        new_id[member] = len(nodes)
        nodes.append(
            Node(
                len(nodes),
                node.op,
                tuple(new_id[i] for i in node.inputs),
                node.shape,
                node.dtype,
                node.name,
                node.attrs,
            )
        )
    return Graph.create(nodes, {"r": new_id[root]}), inputs


def per_op_roots(graph: Graph) -> list[int]:
    """The ops that get a kernel of their own (see the module docstring)."""
    return [
        n.id
        for n in graph.nodes
        if n.op is not Op.PARAMETER and (n.op not in _FREE or (n.id in graph.output_ids and n.op is not Op.CONSTANT))
    ]


def _per_op_step(graph: Graph, root: int, profile: str) -> Step:
    sub, inputs = op_graph(graph, root)
    lowered = lower(sub, plan_cluster(sub, root, PlanOptions(profile)))
    by_param = {f"a{i}": _value_name(graph, i) for i in inputs}
    (out_buf,) = (buf for _, buf in lowered.outputs)
    return Step(lowered.kernels, tuple((buf, by_param[name]) for name, buf in lowered.inputs), ((out_buf, f"v{root}"),))


def per_op_program(graph: Graph, profile: str = "h200") -> Program:
    """One plan per op, in graph order, each value materialised in its own buffer."""
    roots = per_op_roots(graph)
    steps = tuple(_per_op_step(graph, r, profile) for r in roots)
    values = _param_values(graph) | {f"v{r}": (graph.node(r).shape, graph.node(r).dtype) for r in roots}
    return Program("per_op", steps, values, tuple((n, f"v{i}") for n, i in graph.outputs))


def programs(graph: Graph, profile: str = "h200", kinds: Iterable[str] = ("stitch", "per_op")) -> list[Program]:
    build = {"stitch": stitch_program, "per_op": per_op_program}
    return [build[k](graph, profile) for k in kinds]
