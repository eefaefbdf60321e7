"""Accuracy of the CPU kernels' reductions against float64 (figures, not tests): suite cases at test shapes.

Input: the suite cases below (benchmarks/suite.py), compiled by the working tree's CPU generator. Output: per
floating output, the worst scaled error against the fp64 evaluation (`tolerance.scaled_error`, floor 1% of the
reference's RMS) of the CPU kernel and of numpy's float32 evaluation, their ratio and `tolerance.check`'s verdict
(seed 1; the worst CPU error over seeds 1 and 2 at the end).

    PYTHONPATH=. python scripts/kernel_accuracy.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CASES: tuple[tuple[str, tuple[int, ...], str], ...] = (
    ("layernorm_fwd", (512, 128), "f32"),
    ("layernorm_fwd", (64, 3072), "f32"),
    ("layernorm_fwd", (256, 768), "f16"),
    ("layernorm_bwd", (512, 128), "f32"),
    ("layernorm_bwd", (64, 3072), "f32"),
    ("softmax_fwd", (256, 128), "f32"),
    ("softmax_fwd", (32, 4096), "f32"),
    ("softmax_bwd", (256, 128), "f32"),
    ("softmax_bwd", (32, 4096), "f32"),
    ("bias_gelu_fwd", (1024, 1024), "f32"),
    ("gelu_bwd_bias_grad", (1024, 256), "f32"),
    ("gelu_bwd_bias_grad", (512, 3072), "f32"),
    ("dropout_residual_layernorm", (256, 1024), "f32"),
    ("many_short_rows", (8192, 32), "f32"),
    ("few_long_rows", (4, 30000), "f32"),
    ("cross_entropy_fwd", (16, 30522), "f32"),
    ("astitch_fig7", (256, 1024), "f32"),
    ("rmsnorm_bwd", (256, 4096), "f32"),
)


def main() -> int:
    from benchmarks.suite import build_case
    from stitchfleet.compiler.evaluate import evaluate, random_inputs
    from stitchfleet.compiler.targets.cpu.executable import compile_cluster
    from stitchfleet.compiler.tolerance import check, error_floor, scaled_error

    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape, dtype in CASES:
            graph = build_case(name, shape, dtype)
            executable = compile_cluster(graph, Path(tmp))
            for seed in (1, 2):
                inputs = random_inputs(graph, seed)
                got, native = executable(inputs), evaluate(graph, inputs)
                reference = evaluate(graph, inputs, "float64")
                for out, result in got.items():
                    value = np.asarray(result)
                    if not np.issubdtype(value.dtype, np.floating):
                        continue
                    ref = np.asarray(reference[out], np.float64)
                    floor = error_floor(ref, 1e-2)
                    mine, theirs = scaled_error(value, ref, floor), scaled_error(np.asarray(native[out]), ref, floor)
                    worst = max(worst, mine)
                    if seed == 1:
                        verdict = "ok" if check(value, np.asarray(native[out]), ref).ok else "MISS"
                        ratio = mine / max(theirs, 1e-300)
                        print(
                            f"{name:28s} {shape!s:14s} {dtype:4s} {out:8s} cpu {mine:9.2e} "
                            f"numpy f32 {theirs:9.2e} ratio {ratio:5.2f} {verdict}",
                            flush=True,
                        )
    print(f"worst cpu error (seeds 1, 2): {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
