"""The GPU op compiled against `tensorflow==2.15.1`'s own headers (the GPU wheel's, not tensorflow-cpu's):
`scripts/tf_gpu_headers.py` extracts the wheel's include/ and framework library (make test fetches them
into .venv/tf-gpu), and the op library builds with -DGOOGLE_CUDA=1 against them and links with every
symbol resolved against that build's framework library. Loading it into the GPU build is not done here
(the test venv holds tensorflow-cpu)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.native import dispatch_op  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TREE = Path(os.environ.get("STITCHFLEET_TF_GPU_TREE", ROOT / ".venv" / "tf-gpu" / "tensorflow"))
pytestmark = pytest.mark.tf


def _tree() -> Path:
    if (TREE / "libtensorflow_framework.so.2").is_file():
        return TREE
    if os.environ.get("CI"):
        pytest.fail(f"no GPU wheel tree at {TREE}: make test fetches it (scripts/tf_gpu_headers.py)")
    pytest.skip(f"no GPU wheel tree at {TREE}: python scripts/tf_gpu_headers.py .venv/tf-gpu")


@pytest.mark.slow
def test_the_gpu_op_builds_against_the_gpu_wheels_own_headers() -> None:
    tree = _tree()
    assert (tree / "VERSION").read_text().strip() == tf.__version__  # the headers of this TF version's GPU build
    # the GPU build's headers: its CUDA stream executor, of which tensorflow-cpu ships two headers only
    assert len(list((tree / "include" / "xla" / "stream_executor" / "cuda").glob("*.h"))) > 10
    built = dispatch_op.build_against(tree, gpu=True)
    assert b"StitchfleetGpuDispatchOp" in built  # the GPU kernel's class is compiled in
    assert b"sf_program_blame" in built and b"stitchfleet_bridge_faults" in built
