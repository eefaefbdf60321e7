"""The cpu target: C + OpenMP generated from the stitch plan, built by the system C compiler.

Input: a cluster graph and its `StitchPlan`. Output: C source (`source.cluster_source`) that
executable.py compiles (cached as a shared object, cache.py's "cpu" artifacts) and calls through
ctypes; target.py puts it behind the target seam. `cexpr` renders kernel IR expressions and
statements as C; `source` lays out the plan's stages, loops and groups as OpenMP loops;
fused/reduction/rowcache/invariant/pieces/indexmath shape the loops, vmath and finite the
vectorised float functions and the NaN/Inf flag. Unlike the SIMT targets it starts from the
plan, not the kernel IR's threads: a task stays in one CPU thread with reductions in registers.
"""

from stitchfleet.compiler.devices import WARP
from stitchfleet.compiler.targets.base import LibraryFusion, Profile

# TF's grappler remapper with oneDNN (TF 2.15, the default CPU build) rewrites these into one oneDNN primitive
# whose epilogue runs on the output while it is in cache (`_MklNativeFusedMatMul`, `_MklNativeFusedConv2D`,
# `_MklFusedBatchMatMulV2`); a cluster that takes the epilogue leaves a plain `_MklMatMul` and writes and
# rereads the product (profiled on the demo: +0.74 ms of `_MklMatMul` for -0.60 ms of fused MatMul per step).
# With oneDNN off (TF's default on CPUs without AVX-512 VNNI/BF16 or AMX) its Eigen kernels fuse less:
# `_FusedMatMul`/`_FusedConv2D` take BiasAdd and Relu, Relu6, Elu or LeakyRelu only, and depthwise and 3D
# convolutions and BatchMatMul fuse nothing (TF 2.15 on an EPYC: `without_onednn`).
# Not here: Conv2D+FusedBatchNorm (fused only with is_training=false, never in a training step), BiasAddGrad
# (the backward's column reduction: grappler fuses nothing into it on CPU, it stays a stitching candidate).
_ONEDNN = "kept with {compute} for {library}'s fused epilogue (grappler remapper)"
_EIGEN_STAGES = (("BiasAdd",), ("Relu", "Relu6", "Elu", "LeakyRelu"))
LIBRARY_FUSIONS = (
    LibraryFusion(
        ("MatMul",),
        (("BiasAdd",), ("Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Gelu")),
        _ONEDNN,
        without_onednn=_EIGEN_STAGES,
    ),
    LibraryFusion(("Conv2D",), (("BiasAdd",), ("Relu", "Relu6", "Elu", "LeakyRelu")), _ONEDNN),
    LibraryFusion(
        ("DepthwiseConv2dNative", "Conv3D"),
        (("BiasAdd",), ("Relu", "Relu6", "Elu", "LeakyRelu")),
        _ONEDNN,
        without_onednn=(),
    ),
    LibraryFusion(("BatchMatMulV2",), (("Mul",), ("AddV2", "Add")), _ONEDNN, constant_operand=(0,), without_onednn=()),
)

PROFILE = Profile(
    "cpu",
    runs_on="cpu",
    warp=WARP,
    summary="C + OpenMP code on this CPU",
    native_op=True,
    source_from="plan",
    library_fusions=LIBRARY_FUSIONS,
    automatic=True,
    parallel_builds=True,
    beside_library="onednn",
)
