"""Device-aware choice: `placement.route` per cluster, and `selection.choose` on GraphDefs whose nodes
carry `/device:GPU:0`. Here no GPU op can run (no GPU, tensorflow-cpu): GPU-placed clusters stay with TF
with the reason, CPU-placed ones go to the cpu backend, clusters spanning devices stay with TF. Where a
test declares the GPU op runnable (`gpu_op_unavailable` answering None, the arch sm_90), GPU clusters are
really compiled for it (NVRTC cubin, launch plan) without a driver call: launching them needs a GPU and
is not tested here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stitchfleet.plugin.graph.placement import Route, canonical_device, route


class _Op:
    def __init__(self, name: str, device: str) -> None:
        self.name, self.device = name, device


GPU, CPU = "/device:GPU:0", "/device:CPU:0"


def test_auto_sends_gpu_clusters_to_the_gpu_op_and_cpu_clusters_to_the_cpu_backend() -> None:
    assert route([_Op("a", GPU), _Op("b", GPU)], "auto", True, None) == Route("cuda", GPU)
    assert route([_Op("a", CPU)], "auto", True, None) == Route("cpu", CPU)
    assert route([_Op("a", "")], "auto", True, None) == Route("cuda", GPU)  # TF's placer picks GPU:0
    assert route([_Op("a", "")], "auto", False, None) == Route("cpu", CPU)


def test_a_gpu_cluster_stays_with_tf_while_the_gpu_op_cannot_run() -> None:
    left = route([_Op("mul", GPU)], "auto", False, "no GPU visible to TensorFlow in this process")
    assert left.backend is None and left.device == GPU
    assert left.reason == (
        "placed on a GPU (mul on /device:GPU:0): the GPU op cannot run here (no GPU visible to TensorFlow in this"
        " process), the cluster stays with TF"
    )


@pytest.mark.parametrize(
    ("setting", "ops", "backend", "words"),
    [
        ("cpu", [_Op("a", GPU)], None, "the cpu backend runs on the CPU only"),
        ("sim", [_Op("a", CPU)], "sim", None),
        ("sim", [_Op("a", "")], None, "the sim backend runs on the CPU only"),
        ("cuda", [_Op("a", CPU)], None, "stitches GPU clusters only"),
        ("cuda", [_Op("a", "/gpu:1")], "cuda", None),
    ],
)
def test_an_explicit_backend_takes_only_its_device(setting: str, ops: list[_Op], backend: str, words: str) -> None:
    found = route(ops, setting, True, None)
    assert found.backend == backend
    assert (found.reason is None) if words is None else (words in (found.reason or ""))


def test_a_cluster_never_spans_devices() -> None:
    for ops in ([_Op("a", CPU), _Op("b", GPU)], [_Op("a", GPU), _Op("b", "/device:GPU:1")]):
        found = route(ops, "auto", True, None)
        assert found.backend is None and found.device == "" and "spans devices" in (found.reason or "")
    remote = route([_Op("a", "/job:w/task:1/device:GPU:0"), _Op("b", "/job:w/task:0/device:GPU:0")], "auto", True, None)
    assert remote.backend is None  # another task's GPU is another device


def test_partial_device_strings_merge_as_the_placer_merges_them() -> None:
    local = "/job:localhost/replica:0/task:0/device:GPU:0"
    assert route([_Op("a", local), _Op("b", GPU), _Op("c", "")], "auto", True, None) == Route("cuda", local)
    assert route([_Op("a", "/job:w/task:1/cpu:0"), _Op("b", CPU)], "auto", True, None) == Route(
        "cpu", "/job:w/task:1/device:CPU:0"
    )


def test_canonical_devices() -> None:
    assert canonical_device("/job:worker/replica:0/task:1/device:GPU:3", False) == (
        "/job:worker/replica:0/task:1/device:GPU:3"
    )
    assert canonical_device("/gpu:1", False) == "/device:GPU:1"
    assert canonical_device("/cpu:0", True) == CPU
    assert canonical_device("", True) == GPU and canonical_device("", False) == CPU


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        route([_Op("a", CPU)], "gpu", True, None)


def test_a_checking_target_is_no_job_backend() -> None:
    # cuda-cpu is a target folder (settings accept the name) but only `stitchfleet compile --device` runs it
    from stitchfleet.plugin.native.backend_choice import BackendUnavailableError, resolve_backend

    with pytest.raises(ValueError, match="unknown backend 'cuda-cpu'"):
        route([_Op("a", CPU)], "cuda-cpu", True, None)
    with pytest.raises(BackendUnavailableError, match="backend 'cuda-cpu' runs in `stitchfleet compile --device` only"):
        resolve_backend("cuda-cpu")
    assert resolve_backend("sim") == "sim"
    with pytest.raises(BackendUnavailableError, match="backend 'rocm' is unknown"):
        resolve_backend("rocm")


# --- selection.choose on GraphDefs placed on a GPU -------------------------------------------------


def _graph_def() -> Any:
    """The small BERT encoder's graph (a MetaGraphDef: its GraphDef and the variable collections) with every
    node on /device:GPU:0, as a GPU job's graph reads when its ops are pinned there."""
    import tensorflow as tf

    from stitchfleet.demo import models

    model = models.MODELS["bert_encoder"]
    graph = tf.Graph()
    with graph.as_default(), tf.device(GPU):
        tf.compat.v1.set_random_seed(1)
        model.build(model.small)
    with graph.as_default():
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    assert sum(node.device == GPU for node in meta.graph_def.node) > len(meta.graph_def.node) // 2  # the model's ops
    for node in meta.graph_def.node:
        node.device = GPU  # and the rest (initialisers, saver): the whole graph on the GPU
    return meta


def _pinned_to_cpu(meta: Any, names: set[str]) -> Any:
    """A copy of `meta` with the ops `names` moved to /device:CPU:0."""
    copy = type(meta)()
    copy.CopyFrom(meta)
    for node in copy.graph_def.node:
        if node.name in names:
            node.device = CPU
    return copy


def _choose(tmp_path: Path, meta: Any) -> tuple[Any, Any]:
    import tensorflow as tf

    from stitchfleet.compiler.pipeline import Options, compile_graph
    from stitchfleet.plugin.frontend.converter import convert
    from stitchfleet.plugin.graph.mapping import StepOps
    from stitchfleet.plugin.setup import selection
    from tests.plugin.hook_harness import make_settings

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta, clear_devices=False)
    current = make_settings(tmp_path, "routes")
    conversion = convert(StepOps(graph), name="routes")
    art = compile_graph(conversion.graph, Options(baselines=("per_op",)))
    return graph, selection.choose(graph, conversion, art, backend="cpu", known_bad=set(), current=current)


def _devices(graph: Any, site: Any) -> set[str]:
    return {graph.get_operation_by_name(op.name).device for op in site.internal}


@pytest.mark.tf
def test_a_graph_def_on_a_gpu_leaves_every_cluster_to_tf_with_the_reason(tmp_path: Path) -> None:
    _, found = _choose(tmp_path, _graph_def())
    assert not found.sites and found.left
    placed = [reason for _, _, reason in found.left if "placed on a GPU" in reason]
    assert placed and all("the GPU op cannot run here (no GPU visible to TensorFlow" in r for r in placed)


def _half_pinned(tmp_path: Path) -> Any:
    """The GPU graph with every other cluster (as the all-GPU graph's clusters fall) moved to the CPU."""
    meta = _graph_def()
    from stitchfleet.compiler.decision import Decision
    from stitchfleet.compiler.pipeline import Options, compile_graph
    from stitchfleet.plugin.frontend.converter import convert
    from stitchfleet.plugin.graph.mapping import StepOps, map_cluster

    graph, found = _choose(tmp_path / "all-gpu", meta)
    assert not found.mapped and sum("placed on a GPU" in reason for _, _, reason in found.left) >= 4
    conversion = convert(StepOps(graph), name="routes")
    art = compile_graph(conversion.graph, Options(baselines=("per_op",)))
    names: set[str] = set()
    for i, (cg, plan) in enumerate(zip(art.cluster_graphs, art.stitch, strict=True)):
        if i % 2 == 0 and not isinstance(plan, Decision):
            names |= {op.name for op in map_cluster(graph, conversion, i, cg, plan).internal}
    return _pinned_to_cpu(meta, names)


@pytest.mark.tf
def test_cpu_pinned_clusters_are_stitched_and_gpu_ones_are_not(tmp_path: Path) -> None:
    graph, found = _choose(tmp_path, _half_pinned(tmp_path))
    assert found.sites, "the CPU-pinned clusters go to the cpu backend"
    for site, cluster in zip(found.sites, found.clusters, strict=True):
        assert _devices(graph, site) == {CPU}
        assert type(cluster.kernel.executable).__name__ == "CpuExecutable"
    reasons = [reason for _, _, reason in found.left]
    assert any(r.startswith("placed on a GPU") and "the GPU op cannot run here" in r for r in reasons), reasons


@pytest.mark.tf
def test_with_a_runnable_gpu_op_gpu_clusters_are_compiled_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stitchfleet.compiler.targets.cuda.nvrtc import find_nvrtc
    from stitchfleet.plugin.native import gpu_device
    from stitchfleet.plugin.setup import selection

    if find_nvrtc() is None:
        pytest.skip("no libnvrtc: install the dev extra")
    meta = _half_pinned(tmp_path)
    monkeypatch.setattr(selection, "gpu_op_unavailable", lambda cache_dir, bridge, backend: None)
    monkeypatch.setattr(gpu_device, "gpu_arch", lambda device="": "sm_90")  # no driver call follows: none here
    graph, found = _choose(tmp_path, meta)
    kinds: dict[str, set[str]] = {}
    for site, cluster in zip(found.sites, found.clusters, strict=True):
        (placed,) = _devices(graph, site)
        kinds.setdefault(placed, set()).add(type(cluster.kernel.executable).__name__)
    assert kinds == {CPU: {"CpuExecutable"}, GPU: {"CudaNativeKernel"}}
    gpu = [c.kernel.executable.executable for c in found.clusters if c.kernel.executable.binds is False]
    assert gpu and all(e.module_path.is_file() and e.arch == "sm_90" for e in gpu)
    assert not any("the GPU op cannot run here" in reason for _, _, reason in found.left)
