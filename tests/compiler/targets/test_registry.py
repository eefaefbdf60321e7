"""The target registry: every backend folder is found by name, profiled, and runs a cluster behind the seam.

Every target that runs on any machine (`checks_here`: sim, cpu, cuda-cpu) builds the same
layernorm cluster and must match evaluate by the tolerance rule; the name lists that used to
be written out (settings, the compile command's devices, the plugin's routes) read the registry.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from benchmarks.suite import build_case
from stitchfleet import settings
from stitchfleet.compiler import compile_command, devices, targets
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.base import Profile
from stitchfleet.compiler.targets.cache import ARTIFACTS, artifact_cache
from stitchfleet.compiler.tolerance import check_outputs

FOLDERS = sorted(p.name for p in Path(targets.__file__).parent.iterdir() if (p / "__init__.py").is_file())


def _cluster() -> Graph:
    graph = build_case("layernorm_fwd", (24, 200), "f32")
    return extract(graph, find_clusters(graph, 8).clusters[0].nodes)


def test_the_names_are_the_target_folders() -> None:
    assert [name.replace("-", "_") for name in targets.NAMES] == FOLDERS
    assert set(targets.NAMES) == {"sim", "cpu", "cuda", "cuda-cpu"}
    assert ("auto", *targets.NAMES) == settings.BACKENDS


@pytest.mark.parametrize("name", targets.NAMES)
def test_each_target_has_a_profile_of_its_own_name(name: str) -> None:
    profile = targets.profile(name)
    assert isinstance(profile, Profile)
    assert profile.name == name
    assert profile.warp == devices.WARP


def test_an_unknown_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(targets.UnknownTargetError, match=r"'rocm'.*cpu, cuda, cuda-cpu, sim"):
        targets.profile("rocm")
    with pytest.raises(targets.UnknownTargetError, match="'rocm'"):
        targets.load("rocm", Path("unused"))


def test_a_bad_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="runs_on must be one of"):
        Profile("x", runs_on="tpu", warp=32, summary="")
    with pytest.raises(ValueError, match="warp must be positive"):
        Profile("x", runs_on="cpu", warp=0, summary="")


def test_auto_picks_one_target_per_device_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (targets.automatic("cpu"), targets.automatic("gpu")) == ("cpu", "cuda")
    assert targets.profile("cpu").parallel_builds and not targets.profile("cuda").parallel_builds
    assert targets.profile("cpu").beside_library == "onednn"
    # a second automatic target on a kind is a registry error, said as such
    real = targets.profile
    monkeypatch.setattr(
        targets, "profile", lambda name: Profile(name, "cpu", 32, "x", automatic=True) if name == "sim" else real(name)
    )
    with pytest.raises(ValueError, match="2 targets are automatic on 'cpu' devices"):
        targets.automatic("cpu")


def test_the_name_lists_read_the_registry() -> None:
    from stitchfleet.plugin.graph import placement

    assert compile_command.DEVICES == ("reference", "cpu", "cuda-cpu", "sim")
    assert placement.SETTINGS == ("auto", "cpu", "cuda", "sim")
    assert targets.names(runs_on="gpu") == ("cuda",)


@pytest.mark.parametrize("name", targets.names(checks_here=True))
def test_each_target_runs_a_cluster_behind_the_seam(name: str, tmp_path: Path) -> None:
    cluster = _cluster()
    plan = plan_cluster(cluster, 0, PlanOptions(device="tiny"))
    inputs = random_inputs(cluster, seed=3)
    target = targets.load(name, tmp_path)
    assert target.profile is targets.profile(name)
    got = target.build(cluster, plan)(inputs)
    output_checks = check_outputs(got, evaluate(cluster, inputs), evaluate(cluster, inputs, "float64"))
    assert set(got) == {out for out, _ in cluster.outputs}
    assert all(v.ok for v in output_checks.values()), {k: v.reason for k, v in output_checks.items()}


def test_artifact_caches_come_from_one_table(tmp_path: Path) -> None:
    for kind, (folder, suffix) in ARTIFACTS.items():
        cache = artifact_cache(tmp_path, kind)
        assert cache.path("ab12") == tmp_path / folder / f"ab12.{suffix}"
    with pytest.raises(ValueError, match="unknown artifact kind 'ptx'"):
        artifact_cache(tmp_path, "ptx")


def test_the_cuda_target_without_pycuda_says_what_is_missing(tmp_path: Path) -> None:
    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("pycuda is installed: the cuda target's build is tested on a GPU (tests/compiler/targets/cuda)")
    from stitchfleet.compiler.targets.cuda.driver import CudaUnavailableError

    cluster = _cluster()
    target = targets.load("cuda", tmp_path)
    with pytest.raises(CudaUnavailableError, match="pycuda"):
        target.build(cluster, plan_cluster(cluster, 0, PlanOptions(device="tiny")))


def test_source_text_is_found_by_name_for_the_targets_that_have_one() -> None:
    """The pipeline's `sources` stage names no target: each profile says what its text is rendered from, and
    its folder's source_text.py renders it (a new backend adds that file, not a branch in the pipeline)."""
    from stitchfleet.compiler import pipeline

    with_text = targets.names(with_sources=True)
    assert with_text == pipeline.SOURCE_TARGETS == ("cpu", "cuda")
    for name in FOLDERS:
        has_module = importlib.util.find_spec(f"stitchfleet.compiler.targets.{name}.source_text") is not None
        assert has_module == (name.replace("_", "-") in with_text), name
    graph = _cluster()
    plan = plan_cluster(graph, 0, PlanOptions())
    assert "int stitch_cluster0(" in targets.render_source("cpu", 0, graph, plan, None)
    with pytest.raises(ValueError, match="'sim' has no source text"):
        targets.render_source("sim", 0, graph, plan, None)
    with pytest.raises(ValueError, match="from the kernel IR"):
        targets.render_source("cuda", 0, graph, plan, None)
    with pytest.raises(ValueError, match="cuda sources are rendered from the kernel IR: ask for kernels too"):
        pipeline.Options(sources=("cuda",))
    with pytest.raises(ValueError, match="source_from must be one of"):
        Profile("x", runs_on="cpu", warp=32, summary="x", source_from="text")


@pytest.mark.parametrize("name", [n for n in targets.NAMES if targets.profile(n).native_op])
def test_each_native_target_hands_the_dispatch_op_what_it_needs(name: str, tmp_path: Path) -> None:
    native = targets.native(name, tmp_path)
    assert native.profile == targets.profile(name)
    assert callable(native.native) and callable(native.prebuild) and callable(native.native_unavailable)


def test_the_cpu_target_hands_a_native_kernel_with_the_op_attributes(tmp_path: Path) -> None:
    from stitchfleet.compiler.targets.base import Placement

    graph = _cluster()
    kernel = targets.native("cpu", tmp_path).native(graph, plan_cluster(graph, 0, PlanOptions()), Placement("cpu"))
    attrs = kernel.op_attrs()
    assert Path(str(attrs["library"])).is_file() and attrs["symbol"] == kernel.symbol and kernel.binds
    assert kernel.input_shapes == [list(p.shape) for p in graph.parameters]
    assert kernel.output_shapes == [list(graph.node(i).shape) for _, i in graph.outputs]
    assert targets.native("cpu", tmp_path).prebuild(tmp_path / "shim") == []


def test_a_target_the_op_does_not_run_is_refused_as_native(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not run in the TF dispatch op"):
        targets.native("sim", tmp_path)
