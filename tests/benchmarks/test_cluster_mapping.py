"""scripts/cluster_mapping.py: per model, the clusters the hook can map onto the live graph and why not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from stitchfleet.plugin.frontend import kernel_library

pytestmark = pytest.mark.tf

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster_mapping.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_mapping", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def test_reasons_count_together_with_names_and_figures_blanked() -> None:
    general = _script().general
    one = general("reaches ReadVariableOp op 'bn/FusedBatchNormV3/ReadVariableOp_1' outside its inputs")
    other = general("reaches ReadVariableOp op 'bn_2/FusedBatchNormV3/ReadVariableOp' outside its inputs")
    assert one == other == "reaches ReadVariableOp op '…' outside its inputs"
    assert general("output reduce_sum.12 is 4.1e-05 from TF's ops (2.2e-05 allowed)") == (
        "output reduce_sum.N is N from TF's ops (N allowed)"
    )


def test_the_table_of_a_model_with_batch_norm(capsys: pytest.CaptureFixture[str]) -> None:
    """crnn_head (conv + batch norm + BiLSTM): every cluster maps, passes the translation check."""
    module = _script()
    assert module.main(["--model", "crnn_head"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| crnn_head |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    in_clusters, held, clusters, planner, unmapped, mapped, off, refused, installable = (int(c) for c in cells[1:])
    assert in_clusters > 0 and held >= 0
    assert clusters == mapped + planner + unmapped and installable == mapped - off - refused
    assert clusters > 0 and unmapped == 0 and installable == clusters
    reasons = next(line for line in out.splitlines() if line.startswith("- crnn_head:"))
    # what stays out is only the epilogues TF's kernel library here (oneDNN or Eigen) fuses with their MatMul
    # (held on purpose, library_fusions)
    library = "oneDNN" if kernel_library.onednn() else "Eigen"
    assert reasons.count(" x ") == 1 and f"held: kept with MatMul for {library}'s fused epilogue" in reasons, reasons
