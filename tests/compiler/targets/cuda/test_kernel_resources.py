"""The CI gate on what ptxas made of every suite and workload kernel (nvcc, no GPU): registers, spills,
shared memory, occupancy from those figures against the blocks per SM each plan needs, and grid-barrier
co-residency with the planner's headroom. Spills are expected nowhere but in the kernels listed below, each
with its reason; the figures per workload are in benchmarks/README.md (`python -m benchmarks.kernel_resources`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.kernel_resources import SUITE, programs, suite_kernels
from stitchfleet.compiler.devices import device
from stitchfleet.compiler.plan.planner import BARRIER_HEADROOM
from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.nvcc import Nvcc
from stitchfleet.compiler.targets.cuda.render import render_kernel
from stitchfleet.compiler.targets.cuda.resources import GateRow, ResourceUse, gate, gate_row, parse_ptxas

# A grid of more than one block of 1024 threads per SM (more than 132 blocks, or more than 115 for a grid
# barrier, which leaves 1/8 of the resident grid free) runs at most 32 registers a thread: 2 x 1024 x 32 fill
# an SM's 64K registers. Fewer blocks would pack two tasks into some blocks instead (not measured on a GPU).
TWO_BLOCKS_PER_SM = "its grid needs 2 blocks of 1024 threads per SM resident: 32 registers a thread"
SPILLING: dict[str, str] = dict.fromkeys(
    [
        "bias_gelu_fwd_4096x3072_f16_stitch_c0_k0",
        "gelu_bwd_bias_grad_16384x4096_f16_stitch_c0_k0",
        "gelu_bwd_bias_grad_16384x4096_f32_stitch_c0_k0",
        "layernorm_bwd_128x768_f32_stitch_c0_k0",
        "layernorm_bwd_8192x12288_f16_stitch_c0_k0",
        "layernorm_bwd_8192x12288_f32_stitch_c0_k0",
        "layernorm_fwd_8192x12288_f32_stitch_c0_k0",
        "bert_encoder_cluster_02_stitch_c0_k0",
        "bert_encoder_cluster_03_stitch_c0_k0",
        "bert_encoder_cluster_04_stitch_c0_k0",
        "bert_encoder_cluster_05_stitch_c0_k0",
        "bert_encoder_cluster_07_stitch_c0_k0",
        "bert_encoder_cluster_10_stitch_c0_k0",
        "transformer_block_cluster_04_stitch_c0_k0",
        "transformer_block_cluster_06_stitch_c0_k0",
        "dien_attention_gru_cluster_48_stitch_c0_k0",
        "dien_attention_gru_cluster_50_stitch_c0_k0",
        "dien_attention_gru_cluster_53_stitch_c0_k0",
        "dien_attention_gru_cluster_56_stitch_c0_k0",
        "dien_attention_gru_cluster_59_stitch_c0_k0",
        "dien_attention_gru_cluster_62_stitch_c0_k0",
        "dien_attention_gru_cluster_65_stitch_c0_k0",
        "dien_attention_gru_cluster_68_stitch_c0_k0",
        # since its (128, 1) sums became rows (size-1 dimensions left out of a reduction's layout), as 48-68
        "dien_attention_gru_cluster_71_stitch_c0_k0",
        "crnn_head_cluster_29_stitch_c0_k0",
        "crnn_head_cluster_30_stitch_c0_k0",
    ],
    TWO_BLOCKS_PER_SM,
)

REPORT = """\
ptxas info    : 8 bytes gmem
ptxas info    : Compiling entry function 'stitch_c0_k0' for 'sm_90'
ptxas info    : Function properties for stitch_c0_k0
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 160 bytes smem
ptxas info    : Compiling entry function 'stitch_c1_k0' for 'sm_90'
ptxas info    : Function properties for stitch_c1_k0
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers
"""


def test_ptxas_figures_are_read_per_kernel() -> None:
    used = parse_ptxas(REPORT)
    assert used["stitch_c0_k0"] == ResourceUse("stitch_c0_k0", 32, 12, 8, 16, 160)
    assert used["stitch_c0_k0"].spills == 20
    assert used["stitch_c1_k0"] == ResourceUse("stitch_c1_k0", 64, 0, 0, 0, 0)


def test_the_gate_names_each_problem() -> None:
    h200 = device("h200")
    kernel = render_kernel(suite_kernels()[0])
    fine = gate_row(kernel, ResourceUse(kernel.name, 32, 0, 0, 0, 0), h200)
    assert fine.problems == []
    starved = gate_row(kernel, ResourceUse(kernel.name, 255, 4, 4, 0, 0), h200)
    assert any("spill" in p for p in starved.problems)
    assert any("block(s)/SM resident" in p for p in starved.problems)  # 1024 x 255 registers fit no SM
    full = GateRow("k", 32, 0, 0, 0, 1024, 264, 2, 2, True, 264, 0.0)
    assert full.problems == ["grid barrier with 264 of 264 co-resident blocks"]


def _check(rows: list[GateRow]) -> None:
    for row in rows:
        problems = [p for p in row.problems if not (row.name in SPILLING and "spill" in p)]
        assert not problems, f"{row.name}: {problems}"
        if row.barrier:
            assert row.headroom >= BARRIER_HEADROOM, row


def test_a_slice_of_the_suite_passes_the_gate(nvcc: Nvcc, nvcc_cache: ArtifactCache) -> None:
    kernels = [k for k in suite_kernels() if k.name.startswith(("layernorm_fwd_128x768", "softmax_fwd"))]
    assert kernels
    _check(gate(kernels, nvcc, "sm_90", device("h200"), nvcc_cache))


@pytest.mark.slow
@pytest.mark.xdist_group("nvcc_units")  # test_cuda_compile builds its sm_90 units on this worker
def test_every_suite_and_workload_kernel_passes_the_gate(nvcc: Nvcc, nvcc_cache: ArtifactCache) -> None:
    found = {name: gate(kernels, nvcc, "sm_90", device("h200"), nvcc_cache) for name, kernels in programs().items()}
    rows = [row for workload in found.values() for row in workload]
    assert len(rows) >= 223
    _check(rows)
    spilling = {row.name for row in rows if row.spills}
    assert spilling <= set(SPILLING)
    assert set(SPILLING) - spilling == set(), "a listed kernel no longer spills: take it off the list"


def test_the_compile_report_carries_each_kernels_figures(
    nvcc: Nvcc, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from stitchfleet.compiler import compile_command

    path = SUITE / "layernorm_fwd_128x768_f32.json"
    assert compile_command.run(str(path), "json", None, 8, None, cache_dir=tmp_path, ptxas="sm_90") == 0
    (row,) = json.loads(capsys.readouterr().out)["kernel_resources"]
    assert row["cluster"] == 0 and row["name"] == "stitch_c0_k0" and row["problems"] == []
    assert row["registers"] > 32  # a grid of 128 blocks needs one per SM: the launch bounds allow 64
    assert (row["needed_per_sm"], row["resident_per_sm"], row["spills"]) == (1, 1, 0)
