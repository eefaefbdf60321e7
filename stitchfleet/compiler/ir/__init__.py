"""The graph IR: types, immutable graphs, shape inference, builder, JSON and text forms.

Input/output: see the submodules. This package re-exports the public names so
callers write `from stitchfleet.compiler.ir import Graph, GraphBuilder, Op`.
"""

from stitchfleet.compiler.ir.attrs import Attrs
from stitchfleet.compiler.ir.builder import GraphBuilder, Value
from stitchfleet.compiler.ir.graph import Graph, IRError, Node, fingerprint, verify
from stitchfleet.compiler.ir.printer import format_node, print_graph
from stitchfleet.compiler.ir.serialization import (
    FORMAT,
    VERSION,
    IRFormatError,
    dumps,
    from_json,
    load,
    loads,
    save,
    to_json,
)
from stitchfleet.compiler.ir.shapes import DYNAMIC, Shape, ShapeError, TensorType, infer, is_static, num_elements
from stitchfleet.compiler.ir.types import DType, Kind, Op

__all__ = [
    "DYNAMIC",
    "FORMAT",
    "VERSION",
    "Attrs",
    "DType",
    "Graph",
    "GraphBuilder",
    "IRError",
    "IRFormatError",
    "Kind",
    "Node",
    "Op",
    "Shape",
    "ShapeError",
    "TensorType",
    "Value",
    "dumps",
    "fingerprint",
    "format_node",
    "from_json",
    "infer",
    "is_static",
    "load",
    "loads",
    "num_elements",
    "print_graph",
    "save",
    "to_json",
    "verify",
]
