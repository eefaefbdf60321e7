"""GraphDef files: binary .pb and text .pbtxt, read into a `GraphDef` or straight into IR.

Input: a path. Output: the parsed `GraphDef`, or (`convert_file`) its `Conversion`. The rules in full:
docs/plugin/frontend.md.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import message, text_format
from tensorflow.core.framework import graph_pb2

from stitchfleet.plugin.frontend.converter import convert_graph_def
from stitchfleet.plugin.frontend.result import Conversion, FrontendError

SUFFIXES = (".pb", ".pbtxt")


def read_graph_def(path: str | Path) -> graph_pb2.GraphDef:
    """The GraphDef stored in `path` (.pb binary, .pbtxt text)."""
    source = Path(path)
    if source.suffix not in SUFFIXES:
        raise FrontendError(f"{source}: not a GraphDef file (expected {' or '.join(SUFFIXES)})")
    try:
        data = source.read_bytes()
    except OSError as err:
        raise FrontendError(f"cannot read {source}: {err.strerror}") from None
    graph_def = graph_pb2.GraphDef()
    try:
        if source.suffix == ".pbtxt":
            text_format.Parse(data.decode("utf-8"), graph_def)
        else:
            graph_def.ParseFromString(data)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as err:
        raise FrontendError(f"{source}: not a valid {source.suffix} GraphDef (truncated or corrupt?): {err}") from None
    if not graph_def.node:
        raise FrontendError(f"{source}: the GraphDef has no nodes")
    return graph_def


def convert_file(path: str | Path) -> Conversion:
    """Reads and converts a GraphDef file; the graph is named after the file."""
    return convert_graph_def(read_graph_def(path), name=Path(path).stem)
