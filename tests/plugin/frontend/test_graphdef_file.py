"""GraphDef files (.pb, .pbtxt) into IR, `stitchfleet compile FILE.pb`, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf
from google.protobuf import text_format

from stitchfleet import cli
from stitchfleet.compiler.ir import Op
from stitchfleet.compiler.report import CompileReport
from stitchfleet.demo.models import build, training_step
from stitchfleet.plugin.frontend import FrontendError
from stitchfleet.plugin.frontend.graphdef_file import convert_file, read_graph_def

pytestmark = pytest.mark.tf


def _graph_def() -> tf.compat.v1.GraphDef:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        w = tf.compat.v1.placeholder(tf.float32, [16, 16], name="w")
        h = tf.matmul(x, w)
        mean = tf.reduce_mean(h, axis=-1, keepdims=True)
        var = tf.reduce_mean(tf.square(h - mean), axis=-1, keepdims=True)
        y = tf.nn.softmax((h - mean) * tf.math.rsqrt(var + 1e-5))
        tf.gradients(tf.reduce_sum(y * y), [x, w])
    return graph.as_graph_def()


@pytest.fixture(scope="module")
def pb_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pb") / "model.pb"
    path.write_bytes(_graph_def().SerializeToString())
    return path


def test_binary_and_text_graphdefs_give_the_same_ir(pb_file: Path, tmp_path: Path) -> None:
    text = tmp_path / "model.pbtxt"
    text.write_text(text_format.MessageToString(_graph_def()))
    binary, textual = convert_file(pb_file), convert_file(text)
    assert binary.graph.nodes == textual.graph.nodes
    assert binary.graph.metadata["name"] == "model"
    ops = {n.op for n in binary.graph.nodes}
    assert {Op.OPAQUE, Op.REDUCE_MEAN, Op.RSQRT, Op.EXP} <= ops
    matmul = binary.node_of("MatMul:0")
    assert binary.graph.node(matmul).attrs["type"] == "MatMul"
    assert binary.origins[matmul].name == "MatMul:0"


def test_cli_compiles_a_graphdef(pb_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", str(pb_file), "--device", "reference"]) == 0
    out = capsys.readouterr().out
    assert "graph model" in out
    assert "clusters: " in out and "clusters: 0" not in out
    assert "reference evaluation on random inputs" in out


def test_cli_compiles_a_graphdef_at_tf_op_granularity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI hands the frontend's origins to the compiler, as a job's hook does: every cluster it reports
    begins and ends on TF tensors (without them, 10 boundary nodes of this model were TF op pieces)."""
    path = tmp_path / "transformer_block.pb"
    path.write_bytes(training_step(build("transformer_block", "small")).SerializeToString())
    assert cli.main(["compile", str(path), "--report", "json"]) == 0
    report = CompileReport.loads(capsys.readouterr().out)
    origins = convert_file(path).origins
    assert report.clusters and any(d.stage == "op_clusters" and d.action == "redraw" for d in report.decisions)
    assert all(n in origins for c in report.clusters for n in (*c.inputs, *c.outputs))


def test_truncated_pb_is_named(pb_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut.pb"
    cut.write_bytes(pb_file.read_bytes()[:-7])
    with pytest.raises(FrontendError, match=r"cut\.pb: not a valid \.pb GraphDef \(truncated or corrupt\?\)"):
        read_graph_def(cut)
    assert cli.main(["compile", str(cut)]) == cli.EXIT_USAGE
    assert "cut.pb: not a valid .pb GraphDef" in capsys.readouterr().err


def test_unknown_dtype_names_the_node(tmp_path: Path) -> None:
    graph_def = _graph_def()
    node = next(n for n in graph_def.node if n.name == "x")
    node.attr["dtype"].type = 999
    bad = tmp_path / "bad.pb"
    bad.write_bytes(graph_def.SerializeToString())
    with pytest.raises(FrontendError, match=r"bad.*not a valid GraphDef.*invalid DataType enum: 999.*node x"):
        convert_file(bad)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.pb", b"", "the GraphDef has no nodes"),
        ("garbage.pbtxt", b"node { name: ", "not a valid .pbtxt GraphDef"),
        ("model.onnx", b"x", "not a GraphDef file (expected .pb or .pbtxt)"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(FrontendError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        read_graph_def(path)


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", "/nonexistent/model.pb"]) == cli.EXIT_USAGE
    assert "cannot read /nonexistent/model.pb" in capsys.readouterr().err
