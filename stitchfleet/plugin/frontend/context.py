"""The state of one conversion and the view a lowering rule gets of one TF op.

Input: filled by the converter as it walks the TF graph in topological order. Output: The rules in full:
docs/plugin/frontend.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.ir import DType, GraphBuilder, Shape, TensorType, Value
from stitchfleet.plugin.frontend.result import TensorRef

if TYPE_CHECKING:
    import tensorflow as tf

Array = npt.NDArray[Any]
# Larger constant arrays are passed in as parameters, not written into the IR.
MAX_INLINE_CONSTANT = 256


class LoweringError(Exception):
    """A rule cannot lower this op; the message is the reason recorded for the boundary."""


@dataclass(frozen=True)
class Arg:
    """One data operand of a TF op as the frontend sees it."""

    ref: TensorRef
    dtype: DType | None  # None: a TF type the IR has no type for (resource, string...)
    shape: Shape | None  # None: unknown rank; -1 marks an unknown dimension
    known: Array | None  # the value, when it was constant-folded

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(d >= 0 for d in self.shape)


@dataclass
class Lowering:
    """Everything one conversion accumulates."""

    builder: GraphBuilder = field(default_factory=GraphBuilder)
    values: dict[str, Value] = field(default_factory=dict)
    known: dict[str, Array] = field(default_factory=dict)
    origins: dict[int, TensorRef] = field(default_factory=dict)
    kept: set[int] = field(default_factory=set)

    def bind(self, ref: TensorRef, value: Value) -> None:
        """Records that `value` holds the tensor `ref`; the first tensor bound to a node names it."""
        self.values[ref.name] = value
        self.origins.setdefault(value.id, ref)

    def keep(self, ref: TensorRef) -> None:
        """The tensor is read by something outside the IR: its node must stay a graph output."""
        if ref.name in self.values:
            self.kept.add(self.values[ref.name].id)

    def value(self, arg: Arg) -> Value:
        """The IR value of an operand, materialising a folded constant on first use."""
        if arg.ref.name in self.values:
            return self.values[arg.ref.name]
        if arg.known is None or arg.dtype is None:
            raise LoweringError(f"operand {arg.ref.name} has no IR value")
        value = self._materialise(arg.ref, arg.known, arg.dtype)
        self.bind(arg.ref, value)
        return value

    def _materialise(self, ref: TensorRef, array: Array, dtype: DType) -> Value:
        b = self.builder
        if array.size > 0 and np.all(array == array.flat[0]):
            return b.broadcast_to(b.scalar(array.flat[0].item(), dtype), array.shape)
        if array.size <= MAX_INLINE_CONSTANT:
            return b.constant(array, dtype, name=ref.op)
        return b.parameter(ref.name, array.shape, dtype)


@dataclass
class Site:
    """One TF op handed to a lowering rule."""

    op: tf.Operation
    args: list[Arg]
    outs: list[TensorType]
    lowering: Lowering

    @property
    def b(self) -> GraphBuilder:
        return self.lowering.builder

    @property
    def type(self) -> str:
        return str(self.op.type)

    def attr(self, name: str, default: object = None) -> object:
        """The op's attribute `name` as TF gives it, `default` when the op has none."""
        try:
            return self.op.get_attr(name)
        except ValueError:
            return default

    def integer(self, name: str, default: int = 0) -> int:
        """An int attribute (an axis, a mask); LoweringError when the op holds something else there."""
        value = self.attr(name, default)
        if not isinstance(value, int):
            raise LoweringError(f"{self.type} attribute {name!r} is {value!r}, not an int")
        return value

    def number(self, name: str, default: float) -> float:
        """A float attribute (epsilon, alpha); LoweringError when the op holds something else there."""
        value = self.attr(name, default)
        if not isinstance(value, int | float):
            raise LoweringError(f"{self.type} attribute {name!r} is {value!r}, not a number")
        return float(value)

    def integers(self, name: str) -> list[int]:
        """A list-of-ints attribute (squeeze dims), empty when the op has none."""
        value = self.attr(name, []) or []
        if not isinstance(value, list | tuple) or not all(isinstance(v, int) for v in value):
            raise LoweringError(f"{self.type} attribute {name!r} is {value!r}, not a list of ints")
        return [int(v) for v in value]

    def value(self, index: int) -> Value:
        return self.lowering.value(self.args[index])

    def values(self) -> list[Value]:
        return [self.value(i) for i in range(len(self.args))]

    def const(self, index: int, what: str) -> Array:
        """A constant operand (axes, permutation...); LoweringError naming `what` when it is not known."""
        known = self.args[index].known
        if known is None:
            raise LoweringError(f"{what} is not a constant")
        return known

    @property
    def out(self) -> TensorType:
        return self.outs[0]


Rule = Callable[[Site], list[Value]]


@dataclass(frozen=True)
class LiveMarks:
    """What TF keeps only on the Python graph, which a copy made with `import_graph_def` loses: the ops inside
    a TF1 control-flow context (`cond`/`while_loop` v1) and the ops whose outputs a run may not fetch
    (`cond_v2`/`while_v2` internals). A conversion of such a copy takes them from the live graph here, so it
    converts every op as the live graph's conversion does (the same IR, the same node numbers).

    Regression: a tf.estimator job's global-step read (a TF1 cond) was a boundary at `begin` and not in the
    copy rebinding converts for the fed batch, so every later IR node moved by one and no cluster could
    be rebuilt for the job's real batch."""

    control_flow: frozenset[str] = frozenset()
    unfetchable: frozenset[str] = frozenset()

    @classmethod
    def of(cls, graph: tf.Graph, ops: Iterable[tf.Operation]) -> LiveMarks:
        """The marks of `ops` (of the live `graph`)."""
        ops = list(ops)
        in_context = frozenset(op.name for op in ops if getattr(op, "_control_flow_context", None) is not None)
        return cls(in_context, frozenset(op.name for op in ops if not graph.is_fetchable(op)))
