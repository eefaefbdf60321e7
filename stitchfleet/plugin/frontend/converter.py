"""tf.Graph / GraphDef -> IR: walks the TF graph once and decides the fate of every op.

Input: a `tf.Graph` (or a `GraphDef`, imported into a fresh graph first), optionally with shapes that stand in
for partial TF shapes (a job's shape signature, `signatures`). Output: a `Conversion`. The rules in full:
docs/plugin/frontend.md.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import tensorflow as tf

from stitchfleet.compiler.ir import DType, Graph, Node, Op, TensorType, Value
from stitchfleet.plugin.frontend import activations, batchnorm, elementwise, structure
from stitchfleet.plugin.frontend.context import Arg, LiveMarks, Lowering, LoweringError, Rule, Site
from stitchfleet.plugin.frontend.folding import fold
from stitchfleet.plugin.frontend.inlining import inline_functions
from stitchfleet.plugin.frontend.result import Conversion, Disposition, Fate, FrontendError, TensorRef
from stitchfleet.plugin.frontend.tensor_shapes import known_shapes, tensor_shape

RULES: dict[str, Rule] = {**elementwise.RULES, **activations.RULES, **batchnorm.RULES, **structure.RULES}
COMPUTE_INTENSIVE = frozenset(
    {
        "MatMul",
        "BatchMatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
        "Einsum",
        "Conv2D",
        "Conv2DBackpropInput",
        "Conv2DBackpropFilter",
        "Conv3D",
        "Conv3DBackpropInputV2",
        "Conv3DBackpropFilterV2",
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
    }
)
CONTROL_FLOW = frozenset(
    {"Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond", "RefSwitch", "RefMerge", "RefEnter"}
    | {"RefExit", "RefNextIteration", "If", "StatelessIf", "While", "StatelessWhile", "Case"}
    | {"PartitionedCall", "StatefulPartitionedCall"}
)
FEEDABLE = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
ALIASES = frozenset({"Identity", "StopGradient", "PreventGradient", "Snapshot", "IdentityN"})
_PURE_FATES = ("lowered", "folded", "alias")
_PURE_GROUP = "groups side-effect-free ops (ordering only)"
_OPAQUE_ATTRS = ("transpose_a", "transpose_b", "adj_x", "adj_y")
_IR_DTYPES = {d.numpy.name: d for d in DType if d is not DType.BF16} | {"bfloat16": DType.BF16}


def ir_dtype(tf_dtype: tf.DType) -> DType | None:
    """The IR type of a TF dtype (references read as their base type), None when the IR has none."""
    return _IR_DTYPES.get(tf_dtype.base_dtype.name)


def _ref(tensor: Any) -> TensorRef:
    return TensorRef(tensor.op.name, tensor.value_index)


def _out_type(tensor: Any) -> TensorType | None:
    dtype, shape = ir_dtype(tensor.dtype), tensor_shape(tensor)
    return None if dtype is None or shape is None else TensorType(shape, dtype)


class _Walk:
    """One conversion: the lowering state plus every op's disposition."""

    def __init__(self, marks: LiveMarks | None = None) -> None:
        self.low = Lowering()
        self.ops: dict[str, Disposition] = {}
        self.marks = marks or LiveMarks()  # for a copy of a graph: what the live graph knew (LiveMarks)

    def site(self, op: Any) -> tuple[Site, list[TensorType | None]]:
        args = [self._arg(t) for t in op.inputs]
        unbound = batchnorm.UNBOUND_OUTPUTS.get(op.type, frozenset())
        outs = [None if t.value_index in unbound else _out_type(t) for t in op.outputs]
        return Site(op, args, [o for o in outs if o is not None], self.low), outs

    def _arg(self, tensor: Any) -> Arg:
        """An operand; its shape is the IR's when it has an IR value (folding may know more than TF)."""
        ref = _ref(tensor)
        known = self.low.known.get(ref.name)
        value = self.low.values.get(ref.name)
        shape = known.shape if known is not None else value.shape if value is not None else tensor_shape(tensor)
        return Arg(ref, ir_dtype(tensor.dtype), shape, known)

    def record(self, op: Any, fate: Fate, reason: str = "") -> None:
        self.ops[op.name] = Disposition(op.type, fate, reason)

    def keep_inputs(self, op: Any) -> None:
        for tensor in op.inputs:
            self.low.keep(_ref(tensor))

    def cut(self, op: Any, outs: list[TensorType | None], reason: str) -> None:
        """Each output becomes a PARAMETER; what the op reads stays a graph output."""
        self.keep_inputs(op)
        made = False
        for tensor, out in zip(op.outputs, outs, strict=True):
            if out is not None:
                self.low.bind(_ref(tensor), self.low.builder.parameter(_ref(tensor).name, out.shape, out.dtype))
                made = True
        self.record(op, "boundary" if made else "dropped", reason if made else f"{reason}; no data outputs")

    def opaque(self, site: Site, outs: list[TensorType | None], reason: str) -> None:
        """Each output becomes an OPAQUE node reading the op's IR operands."""
        op, low = site.op, self.low
        operands = [low.value(a) for a in site.args if a.dtype is not None and _has_value(low, a)]
        attrs: dict[str, object] = {"type": op.type, "reason": reason}
        attrs.update({k: bool(site.attr(k)) for k in _OPAQUE_ATTRS if site.attr(k) is not None})
        for tensor, out in zip(op.outputs, outs, strict=True):
            if out is None:
                continue
            extra = {"output": tensor.value_index} if len(op.outputs) > 1 else {}
            name = op.name if len(op.outputs) == 1 else _ref(tensor).name
            node = low.builder.op(Op.OPAQUE, operands, {**attrs, **extra}, declared=out, name=name)
            low.bind(_ref(tensor), node)
        if len(outs) > len([o for o in outs if o is not None]):
            self.keep_inputs(op)
        self.record(op, "boundary", reason)

    def visit(self, op: Any) -> None:
        site, outs = self.site(op)
        in_context = op.name in self.marks.control_flow or getattr(op, "_control_flow_context", None) is not None
        if op.type in CONTROL_FLOW or in_context:
            return self.cut(op, outs, "control flow")
        if op.op_def.is_stateful:
            return self.cut(op, outs, f"stateful op {op.type}")
        if op.control_inputs and not self._ordering_only(op):
            return self._controlled(site, outs)
        if op.type == "Const":
            return self._constant(op)
        if None not in outs and self._fold(site):
            return None
        return self._lower(site, outs)

    def _constant(self, op: Any) -> None:
        dtype = ir_dtype(op.outputs[0].dtype)
        if dtype is None:
            self.record(op, "dropped", f"constant of type {op.outputs[0].dtype.name}, which the IR has no type for")
            return
        self.low.known[_ref(op.outputs[0]).name] = tf.make_ndarray(op.get_attr("value")).astype(dtype.numpy)
        self.record(op, "folded", "constant")

    def _fold(self, site: Site) -> bool:
        values = fold(site)
        if values is None:
            return False
        for tensor, value in zip(site.op.outputs, values, strict=True):
            self.low.known[_ref(tensor).name] = value
        self.record(site.op, "folded", "constant-folded")
        return True

    def _lower(self, site: Site, outs: list[TensorType | None]) -> None:
        op = site.op
        if not outs or (None in outs and not _untyped_ok(op.type, outs)):
            return self._untyped(site, outs)
        if op.type in FEEDABLE or not site.args:
            return self.cut(op, outs, "graph input")
        reason = self._opaque_reason(site)
        if reason is not None:
            return self.opaque(site, outs, reason)
        if op.type in ALIASES:
            return self._alias(site)
        return self._apply(site, outs)

    def _opaque_reason(self, site: Site) -> str | None:
        """Why this op, whose outputs the IR can hold, still stays an OPAQUE boundary (None: it does not)."""
        kind = site.type
        unread = batchnorm.UNREAD_OPERANDS.get(kind, frozenset())
        if not all(a.is_static for i, a in enumerate(site.args) if a.dtype is not None and i not in unread):
            return "dynamic shape"
        if kind in structure.NEEDS_RESULT_SHAPE and not all(_static(o) for o in site.outs):
            return "dynamic shape"
        if kind in COMPUTE_INTENSIVE:
            return "compute-intensive"
        hidden = [
            t.op.name for t in site.op.inputs if t.op.name in self.marks.unfetchable or not t.graph.is_fetchable(t.op)
        ]
        if hidden:
            # A stitched cluster's inputs are fetched on check steps: an op reading an output TF does not
            # let a run fetch (a cond_v2 `If`: the global-step read MonitoredTrainingSession adds) stays
            # with TF. Regression: it joined an attention cluster and failed the job's first check step.
            return f"reads {hidden[0]}, whose outputs TF does not let a run fetch"
        if kind in ALIASES:
            return None if all(_has_value(self.low, a) for a in site.args) else "an operand has no IR value"
        return None if kind in RULES else f"unsupported op {kind}"

    def _untyped(self, site: Site, outs: list[TensorType | None]) -> None:
        if not outs:
            self.keep_inputs(site.op)
            self._keep_controls(site.op)
            pure = site.op.type == "NoOp" and site.op.control_inputs and self._ordering_only(site.op)
            return self.record(site.op, "dropped", _PURE_GROUP if pure else "no data outputs")
        if all(o is None for o in outs):
            self.keep_inputs(site.op)
            return self.record(site.op, "dropped", "outputs of a type or rank the IR cannot hold")
        return self.opaque(site, outs, "some outputs have a type or rank the IR cannot hold")

    def _ordering_only(self, op: Any) -> bool:
        """Control inputs from side-effect-free ops that became IR only order execution (TF's gradient
        functions add them to delay work, gradient tuples group them in a NoOp); a dataflow graph
        keeps that order by itself."""
        return all(self._pure(c.name) for c in op.control_inputs)

    def _pure(self, name: str) -> bool:
        disposition = self.ops.get(name)
        return disposition is not None and (disposition.fate in _PURE_FATES or disposition.reason == _PURE_GROUP)

    def _controlled(self, site: Site, outs: list[TensorType | None]) -> None:
        """An op ordered after side effects: a boundary, and what it waits for stays visible."""
        op = site.op
        self._keep_controls(op)
        if not outs:
            self.keep_inputs(op)
            return self.record(op, "dropped", "control inputs; no data outputs")
        if not site.args:
            return self.cut(op, outs, "control inputs")
        return self.opaque(site, outs, "control inputs")

    def _keep_controls(self, op: Any) -> None:
        for control in op.control_inputs:
            for tensor in control.outputs:
                self.low.keep(_ref(tensor))

    def _alias(self, site: Site) -> None:
        for tensor, arg in zip(site.op.outputs, site.args, strict=False):
            self.low.values[_ref(tensor).name] = self.low.value(arg)
        self.record(site.op, "alias", "forwards its input")

    def _apply(self, site: Site, outs: list[TensorType | None]) -> None:
        op = site.op
        typed = [t for t, o in zip(op.outputs, outs, strict=True) if o is not None]
        if any(a.dtype is None for a in site.args):
            return self.opaque(site, outs, "an operand has a type the IR cannot hold")
        try:
            values = RULES[op.type](site)
        except LoweringError as err:
            return self.opaque(site, outs, str(err))
        except (ValueError, IndexError, TypeError, KeyError) as err:  # ShapeError included: never fail a job
            return self.opaque(site, outs, f"not lowered: {err}")
        wrong = [(v, o) for v, o in zip(values, site.outs, strict=True) if not _matches(v, o)]
        if wrong or len(values) != len(site.outs):
            # a rule bug; the nodes it built are pruned as nothing reads them
            return self.opaque(site, outs, f"not lowered: the rule gave {_types(values)}, TF says {_types(site.outs)}")
        for tensor, value in zip(typed, values, strict=True):
            self.low.bind(_ref(tensor), value)
        self.record(op, "lowered")


def _untyped_ok(kind: str, outs: list[TensorType | None]) -> bool:
    """The op's rule gives values for its typed outputs only: its untyped ones are read by no lowered op."""
    allowed = batchnorm.UNBOUND_OUTPUTS.get(kind, frozenset())
    return all(o is not None or i in allowed for i, o in enumerate(outs))


def _types(values: Sequence[Value | TensorType]) -> str:
    return ", ".join(f"{v.dtype.value}{list(v.shape)}" for v in values)


def _matches(value: Value, out: TensorType) -> bool:
    """The lowered value has TF's type (TF's unknown dims match any size)."""
    same_rank = len(value.shape) == len(out.shape)
    dims = same_rank and all(t in (-1, v) for v, t in zip(value.shape, out.shape, strict=False))
    return dims and value.dtype is out.dtype


def _static(out: TensorType) -> bool:
    return all(d >= 0 for d in out.shape)


def _has_value(low: Lowering, arg: Arg) -> bool:
    return arg.ref.name in low.values or arg.known is not None


def ordered(ops: Iterable[tf.Operation]) -> list[tf.Operation]:
    """Ops in a topological order of data and control edges, creation order where free; loops come last."""
    ops = list(ops)
    position = {op.name: i for i, op in enumerate(ops)}
    preds = {op.name: {t.op.name for t in op.inputs} | {c.name for c in op.control_inputs} for op in ops}
    users: dict[str, list[str]] = {op.name: [] for op in ops}
    for name, sources in preds.items():
        for source in sources:
            users[source].append(name)
    pending = {name: len(sources) for name, sources in preds.items()}
    ready = [position[op.name] for op in ops if not pending[op.name]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[ops[index].name]:
            pending[user] -= 1
            if not pending[user]:
                heapq.heappush(ready, position[user])
    done = set(order)
    return [ops[i] for i in order] + [op for i, op in enumerate(ops) if i not in done]


def _outputs(low: Lowering) -> dict[str, int]:
    """Tensors read outside the IR, and mapped tensors nothing in the IR reads (leaves excluded)."""
    nodes = low.builder.nodes
    used = {i for node in nodes for i in node.inputs}
    wanted = low.kept | (set(low.origins) - used)
    chosen = sorted(i for i in wanted if nodes[i].op not in (Op.PARAMETER, Op.CONSTANT))
    return {(low.origins[i].name if i in low.origins else f"node{i}"): i for i in chosen}


def _prune(nodes: list[Node], outputs: dict[str, int]) -> tuple[list[Node], dict[int, int]]:
    live, stack = set(outputs.values()), list(outputs.values())
    while stack:
        for source in nodes[stack.pop()].inputs:
            if source not in live:
                live.add(source)
                stack.append(source)
    renumber = {old: new for new, old in enumerate(sorted(live))}
    kept = [
        Node(renumber[n.id], n.op, tuple(renumber[i] for i in n.inputs), n.shape, n.dtype, n.name, n.attrs)
        for n in nodes
        if n.id in live
    ]
    return kept, renumber


def _assemble(walk: _Walk, name: str) -> Conversion:
    low = walk.low
    outputs = _outputs(low)
    if not outputs:
        raise FrontendError(f"graph {name!r}: no TF op could be converted to an IR op with an output")
    nodes, renumber = _prune(low.builder.nodes, outputs)
    graph = Graph.create(
        nodes,
        {k: renumber[v] for k, v in outputs.items()},
        {"name": name, "source": "tensorflow", "tf_ops": len(walk.ops)},
    )
    origins = {renumber[i]: ref for i, ref in low.origins.items() if i in renumber}
    tensors = {t: renumber[v.id] for t, v in low.values.items() if v.id in renumber}
    return Conversion(graph, origins, tensors, dict(walk.ops), dict(low.known))


class Operations(Protocol):
    """What `convert` reads of a graph: a `tf.Graph`, or a training step's ops (`graph.mapping.StepOps`)."""

    def get_operations(self) -> list[tf.Operation]: ...


def convert(
    graph: Operations,
    name: str = "graph",
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    marks: LiveMarks | None = None,
) -> Conversion:
    """Converts a `tf.Graph`; see the module docstring. `shapes` (tensor name -> shape) stands in for TF's
    shape of a tensor where that is partial, e.g. under a job's shape signature; `marks`, for a copy of a
    graph, what only the live graph knew (`LiveMarks`)."""
    with known_shapes(shapes):
        walk = _Walk(marks)
        for op in ordered(graph.get_operations()):
            walk.visit(op)
        return _assemble(walk, name)


def convert_graph_def(graph_def: tf.compat.v1.GraphDef, name: str = "graph") -> Conversion:
    """Imports a GraphDef into a fresh graph (known calls and conds inlined, inlining.py) and converts it;
    a malformed GraphDef raises FrontendError."""
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.graph_util.import_graph_def(inline_functions(graph_def), name="")
    except (ValueError, TypeError, tf.errors.OpError) as err:
        raise FrontendError(f"graph {name!r} is not a valid GraphDef: {_first_lines(str(err))}") from None
    return convert(graph, name)


def _first_lines(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:4])
