"""IR graph -> a torch function, so Inductor (`torch.compile`) compiles the same subgraph we stitch.

Input: a `Graph` with no OPAQUE op, and a precision: "native" keeps every value in its
IR dtype (what a framework runs), "float64" computes floats in float64 (the harness
uses it as the reference on the GPU where `evaluate` on the host would be too slow).
Output: a function from a dict parameter name -> tensor to a dict output name ->
tensor, on whatever device the inputs live. Meanings follow
`stitchfleet.compiler.evaluate`: after every op the result is cast to the node's dtype;
f16/bf16 sums and means accumulate in float32 and round once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from stitchfleet.compiler.ir import DType, Graph, Node, Op

Fn = Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]

DTYPES: dict[DType, torch.dtype] = {
    DType.F16: torch.float16,
    DType.BF16: torch.bfloat16,
    DType.F32: torch.float32,
    DType.F64: torch.float64,
    DType.I32: torch.int32,
    DType.I64: torch.int64,
    DType.BOOL: torch.bool,
}
_UNARY: dict[Op, Callable[[torch.Tensor], torch.Tensor]] = {
    Op.NEG: torch.neg,
    Op.ABS: torch.abs,
    Op.SQUARE: torch.square,
    Op.RELU: torch.relu,
    Op.LOGICAL_NOT: torch.logical_not,
    Op.SIGN: torch.sign,
    Op.FLOOR: torch.floor,
    Op.CEIL: torch.ceil,
    Op.EXP: torch.exp,
    Op.LOG: torch.log,
    Op.LOG1P: torch.log1p,
    Op.TANH: torch.tanh,
    Op.SIGMOID: torch.sigmoid,
    Op.ERF: torch.erf,
    Op.RSQRT: torch.rsqrt,
    Op.SQRT: torch.sqrt,
    Op.RECIPROCAL: torch.reciprocal,
    Op.CAST: lambda x: x,  # the cast to the node's dtype happens for every node
}
_BINARY: dict[Op, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    Op.ADD: torch.add,
    Op.SUB: torch.sub,
    Op.MUL: torch.mul,
    Op.DIV: torch.div,
    Op.POW: torch.pow,
    Op.MAXIMUM: torch.maximum,
    Op.MINIMUM: torch.minimum,
    Op.GREATER: torch.gt,
    Op.GREATER_EQUAL: torch.ge,
    Op.LESS: torch.lt,
    Op.LESS_EQUAL: torch.le,
    Op.EQUAL: torch.eq,
    Op.NOT_EQUAL: torch.ne,
    Op.LOGICAL_AND: torch.logical_and,
    Op.LOGICAL_OR: torch.logical_or,
}
_WIDE = (torch.float16, torch.bfloat16)


class TranslationError(ValueError):
    """The graph holds an op this translator has no meaning for."""


def dtype_of(dtype: DType, precision: str = "native") -> torch.dtype:
    """The torch dtype that holds values of `dtype` (float64 for every float in float64 precision)."""
    return torch.float64 if precision == "float64" and dtype.is_float else DTYPES[dtype]


def _reduce(node: Node, x: torch.Tensor) -> torch.Tensor:
    axes = list(node.attrs.get_ints("axes"))
    acc = torch.float32 if x.dtype in _WIDE else None
    if node.op is Op.REDUCE_MAX:
        return torch.amax(x, dim=axes)
    if node.op is Op.REDUCE_MIN:
        return torch.amin(x, dim=axes)
    if node.op is Op.REDUCE_SUM:
        return torch.sum(x, dim=axes, dtype=acc)
    if node.op is Op.REDUCE_MEAN:
        return torch.mean(x, dim=axes, dtype=acc)
    out = x if acc is None else x.to(acc)
    for axis in reversed(axes):  # torch.prod takes one dim at a time
        out = torch.prod(out, dim=axis)
    return out


def _broadcast(node: Node, x: torch.Tensor) -> torch.Tensor:
    expanded = [1] * len(node.shape)
    for i, d in enumerate(node.attrs.get_ints("dims")):
        expanded[d] = x.shape[i]
    return x.reshape(expanded).expand(node.shape)


def _slice(node: Node, x: torch.Tensor) -> torch.Tensor:
    a = node.attrs
    ranges = zip(a.get_ints("begin"), a.get_ints("end"), a.get_ints("strides"), strict=True)
    return x[tuple(slice(b, e, s) for b, e, s in ranges)]


def _constant(node: Node, precision: str, device: torch.device) -> torch.Tensor:
    value = node.attrs.get("value")
    dtype = dtype_of(node.dtype, precision)
    if isinstance(value, tuple):
        return torch.tensor(value, dtype=torch.float64, device=device).reshape(node.shape).to(dtype)
    return torch.full(node.shape, value, dtype=dtype, device=device)


def _compute(node: Node, args: Sequence[torch.Tensor], precision: str, device: torch.device) -> torch.Tensor:
    op = node.op
    if op in _UNARY:
        return _UNARY[op](args[0])
    if op in _BINARY:
        return _BINARY[op](args[0], args[1])
    if op.is_reduction:
        return _reduce(node, args[0])
    handlers: dict[Op, Callable[[], torch.Tensor]] = {
        Op.SELECT: lambda: torch.where(args[0], args[1], args[2]),
        Op.BROADCAST: lambda: _broadcast(node, args[0]),
        Op.RESHAPE: lambda: args[0].reshape(node.shape),
        Op.TRANSPOSE: lambda: args[0].permute(node.attrs.get_ints("perm")),
        Op.SLICE: lambda: _slice(node, args[0]),
        Op.CONCAT: lambda: torch.cat(list(args), dim=node.attrs.get_int("axis")),
        Op.CONSTANT: lambda: _constant(node, precision, device),
    }
    if op not in handlers:
        raise TranslationError(f"{node.label}: no torch translation for {op.value}")
    return handlers[op]()


def check_translatable(graph: Graph) -> None:
    """Raises TranslationError naming the first node this translator cannot express."""
    for node in graph.nodes:
        if node.op is Op.OPAQUE:
            raise TranslationError(f"{node.label}: OPAQUE ops have no torch translation")


def to_torch(graph: Graph, precision: str = "native") -> Fn:
    """The graph as a function of tensors (wrap it in `torch.compile` to let Inductor fuse it)."""
    check_translatable(graph)
    if precision not in ("native", "float64"):
        raise ValueError(f"precision must be 'native' or 'float64', got {precision!r}")

    def run(inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        device = next(iter(inputs.values())).device if inputs else torch.device("cpu")
        values: list[torch.Tensor] = []
        for node in graph.nodes:
            if node.op is Op.PARAMETER:
                result = inputs[str(node.attrs["name"])]
            else:
                result = _compute(node, [values[i] for i in node.inputs], precision, device)
            values.append(result.to(dtype_of(node.dtype, precision)))
        return {name: values[node_id] for name, node_id in graph.outputs}

    return run
