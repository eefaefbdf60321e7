"""The four committed workloads pass `stitchfleet compile GRAPH --device D` on every backend that checks here.

Each run is the command's own path (compile_command.run): the whole graph compiled for the h200
profile, then every cluster's stitched code on the device against evaluate, with the tolerance rule.
The sweep runs the (workload, device) pairs of reference, cpu and sim (sim on the transformer block
alone is about a minute; cuda-cpu: see COMMAND_DEVICES);
the default tier runs `reference` on the two small graphs and the cluster that once failed (transformer
block cluster 8, Adam's update, `div.362`: docs/tolerance.md) on sim (cuda-cpu: the sweep).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from stitchfleet.compiler import ir
from stitchfleet.compiler.compile_command import DEVICES, EXIT_OK, check_clusters, run
from stitchfleet.compiler.pipeline import Options, compile_graph

WORKLOADS = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads"
NAMES = sorted(p.parent.name for p in WORKLOADS.glob("*/graph.json"))
BACKENDS = ("sim", "cpu", "cuda-cpu")
ADAM_CLUSTER = 8


def _passes(text: str) -> None:
    assert "FAIL" not in text and "not lowered" not in text and "evaluate failed" not in text, text


def test_the_four_workloads_and_every_backend_are_here() -> None:
    assert NAMES == ["bert_encoder", "crnn_head", "dien_attention_gru", "transformer_block"]
    assert set(DEVICES) == {"reference", *BACKENDS}


# the default tier's slice of the sweep: reference on the two small graphs (about 0.5 s each; the other two
# take 6-14 s), crnn_head's through its clusters (its Conv2D has no meaning in evaluate)
FAST = {("crnn_head", "reference"), ("dien_attention_gru", "reference")}
SWEEP_SECONDS = 2400


def _sweep(name: str, device: str) -> object:
    if (name, device) in FAST:
        return pytest.param(name, device, id=f"{name}-{device}")
    # sim on the transformer block: 67 s on a quiet machine, past pytest's 600 s at load 14
    marks = [pytest.mark.slow, pytest.mark.sweep, pytest.mark.timeout(SWEEP_SECONDS)]
    return pytest.param(name, device, marks=marks, id=f"{name}-{device}")


# cuda-cpu runs one fiber per CUDA thread: the h200 plan's grids of a whole workload did not finish
# bert_encoder's first cluster in 15 min on this 2-core machine (loaded); every workload cluster runs
# on cuda-cpu planned for the `tiny` profile instead (test_every_workload_cluster_on_cuda_cpu, sweep),
# and the Adam cluster below on the h200 plan.
COMMAND_DEVICES = tuple(d for d in DEVICES if d != "cuda-cpu")


@pytest.mark.parametrize(("name", "device"), [_sweep(n, d) for n in NAMES for d in COMMAND_DEVICES])
def test_workload_on_device(name: str, device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    budget = Options().remote_budget  # the CLI's default, STITCHFLEET_REMOTE_STITCH_BUDGET
    status = run(str(WORKLOADS / name / "graph.json"), "table", device, budget, None, cache_dir=tmp_path)
    text = capsys.readouterr().out
    assert status == EXIT_OK, text
    _passes(text)
    assert text.count(" ok") >= 1, text


@pytest.mark.slow
@pytest.mark.parametrize(
    "device", [pytest.param("sim"), pytest.param("cuda-cpu", marks=[pytest.mark.cuda_cpu, pytest.mark.sweep])]
)
def test_the_adam_cluster_of_the_transformer_block(device: str, tmp_path: Path) -> None:
    """2.45e-3 on sim and cuda-cpu where 9.9e-4 was allowed and 1e-3 was the cap: a correct order of an
    element whose v' cancels 2900-fold; it passes by the linear cap now (tolerance.py)."""
    graph = ir.load(WORKLOADS / "transformer_block" / "graph.json")
    art = compile_graph(graph, Options())
    out = io.StringIO()
    status = check_clusters(art, device, out, cache_dir=tmp_path, only={ADAM_CLUSTER})
    text = out.getvalue()
    assert status == EXIT_OK, text
    _passes(text)
    line = next(t for t in text.splitlines() if f"cluster {ADAM_CLUSTER} div.362 " in t)
    assert "backward-stability allowance" in line, line
