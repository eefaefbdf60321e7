"""Which of the compiler's clusters the hook installs: each mapped onto the TF graph and built, or left to TF.

Input: the TF graph, the frontend's `Conversion`, the compiler's artifacts, the backend, the fleet's reverted
fingerprints and slower verdicts, the settings, an optional test `Fault`, the rank and whether Horovod ranks
must agree on the installed set. Output: The rules in full: docs/plugin/setup.md.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stitchfleet import settings as settings_module
from stitchfleet.compiler import targets
from stitchfleet.compiler.decision import Decision
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.fleet.verdict_keys import input_shapes, profile
from stitchfleet.plugin.frontend import kernel_library
from stitchfleet.plugin.graph import placement
from stitchfleet.plugin.graph.mapping import Site, UnmappableError, map_cluster
from stitchfleet.plugin.graph.training_steps import step_values, training_path
from stitchfleet.plugin.horovod.setup_agreement import SLOTS
from stitchfleet.plugin.native import dispatch_op, gpu_device
from stitchfleet.plugin.native.backend_choice import gpu_op_unavailable
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.native.kernels import ClusterKernel
from stitchfleet.plugin.setup import setup_record
from stitchfleet.plugin.shapes.signatures import Specialisation
from stitchfleet.telemetry.slow_verdicts import SlowerVerdict

if TYPE_CHECKING:
    import tensorflow as tf

    from stitchfleet.compiler.pipeline import Artifacts
    from stitchfleet.plugin.frontend import Conversion

log = logging.getLogger("stitchfleet.plugin")


@dataclass
class Compiles:
    """What building the job's clusters cost (the log line and the job's `setup` event say it)."""

    built: int = 0  # clusters built: compiled here, or loaded from the kernel cache
    compiled: int = 0  # of those, compiled here (a kernel cache miss: the C compiler ran)
    seconds: float = 0.0  # wall seconds from the first build's start to the last one's end
    over_budget: int = 0  # clusters left to TF because the compile budget was spent
    workers: int = 1

    def describe(self, budget: float) -> str:
        text = (
            f"{self.built} cluster(s) built in {self.seconds:.2f} s ({self.compiled} compiled, "
            f"{self.built - self.compiled} from the kernel cache; {self.workers} at a time)"
        )
        if self.over_budget:
            text += f"; {self.over_budget} left to TF past the {budget:g} s compile budget"
        return text


@dataclass
class Candidates:
    sites: list[Site] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)
    mapped: list[Site] = field(default_factory=list)
    left: list[tuple[int, str, str]] = field(default_factory=list)  # (index, fingerprint, reason)
    slower: list[tuple[int, str, str]] = field(default_factory=list)  # the fleet's verdict, as left
    compiles: Compiles = field(default_factory=Compiles)
    background: threading.Thread | None = None  # compiles past the budget into the cache, for the next pod
    recorded: str = ""  # the setup's record in the kernel cache (`setup_record.record_key`): its run adds figures
    building_op: bool = False  # this setup started the native op's build (neither shipped with the shim nor cached)

    def refuse(self, refused: dict[int, str]) -> None:
        """Leaves the built clusters whose site index is in `refused` to TF, with its reason."""
        kept = [k for k, site in enumerate(self.sites) if site.index not in refused]
        for site, cluster in zip(self.sites, self.clusters, strict=True):
            if site.index in refused:
                self.left.append((cluster.index, cluster.fingerprint, refused[site.index]))
        self.sites, self.clusters = [self.sites[k] for k in kept], [self.clusters[k] for k in kept]


def _left_to_tf(site: Site, path: frozenset[str], where: placement.Route) -> str | None:
    """Why a mapped cluster stays with TF before any rewrite: its placement (no backend for its device,
    or it spans devices: `placement.route`), off the training path, or a TF fault in its fallback."""
    if where.backend is None:
        return where.reason
    if not any(op.name in path for op in site.internal):
        return "not on the training path (no variable update depends on it): evals and metrics run it as written"
    onednn = targets.profile(where.backend).beside_library == "onednn" and kernel_library.onednn()
    return fallback_hazard(site.internal, onednn=onednn)


# Activations grappler's remapper fuses into a FusedBatchNorm on oneDNN CPUs (Relu6 measured fine).
FUSED_ACTIVATIONS = frozenset({"Relu", "Elu", "LeakyRelu"})


def fallback_hazard(ops: Iterable[tf.Operation], *, onednn: bool) -> str | None:
    """Why the cluster's TF ops cannot run as a graph function here, or None. On a oneDNN build (TF's
    default on x86 CPUs), grappler fuses a FusedBatchNorm whose output 0 feeds an activation (directly,
    or through an Add of a side input) inside a function into one op that then fails every call
    ("Missing 0-th output from FusedBatchNormV3"): every Keras CNN job (ResNet50, Xception,
    DenseNet121, NASNetMobile) failed its first twin step and reverted. The same ops in the user's
    graph run fine. Judged on the cluster's own ops, as the function holds them."""
    if not onednn:
        return None
    inside = {op.name for op in ops}
    for op in ops:
        if not op.type.startswith("FusedBatchNorm") or "Grad" in op.type:
            continue
        readers = [r for r in op.outputs[0].consumers() if r.name in inside]
        sums = [r for r in readers if r.type in ("Add", "AddV2")]
        readers += [after for r in sums for after in r.outputs[0].consumers() if after.name in inside]
        fused = next((r for r in readers if r.type in FUSED_ACTIVATIONS), None)
        if fused is not None:
            why = f"{op.type} {op.name!r} feeds a {fused.type}"
            return f"left to TF: {why}, which TF's oneDNN remapper breaks inside the fallback function"
    return None


def _mapped(
    graph: Any,
    conversion: Any,
    index: int,
    compiled: tuple[Any, Any],
    path: frozenset[str],
    *,
    routes: Any,
    read: frozenset[str],
) -> tuple[Site, str, str] | str:
    """The cluster's site (from its compiled graph and plan) and its backend, or why it is left to TF. `read`: the
    ops whose values a training step may use (`step_values`)."""
    try:
        site = map_cluster(graph, conversion, index, *compiled, read=read)  # a change for TF: site.changes say why
        for change in site.changes:
            log.debug("stitchfleet: cluster %d %s: %s", index, change.action, change.reason)
        where = routes(site.internal)
        left = _left_to_tf(site, path, where)
    except UnmappableError as err:
        return f"not mapped: {err}"
    except Exception as err:
        return f"not mapped: {type(err).__name__}: {err}"
    return (site, where.backend, where.device) if left is None else left


def _router(backend: str, current: settings_module.Settings) -> Any:
    """ops -> placement.Route for this job. `cpu` is also what `auto` resolves to: the setting tells them
    apart. Whether the GPU op can run is asked on the first GPU-placed cluster only."""
    automatic = backend == targets.automatic("cpu") and current.backend in ("auto", backend)
    setting = current.backend if automatic else backend
    visible = gpu_device.gpu_visible()
    gpu_op: list[str | None] = []

    def routes(ops: Any) -> placement.Route:
        ops = list(ops)
        where = placement.route(ops, setting, visible, None)  # as if the GPU op could run here
        if where.backend is not None and targets.profile(where.backend).runs_on == "gpu":
            if not gpu_op:
                gpu_op.append(gpu_op_unavailable(current.cache_dir, current.bridge, where.backend))
            where = placement.route(ops, setting, visible, gpu_op[0])
        return where

    return routes


def compile_workers(current: settings_module.Settings, building_op: bool = False) -> int:
    """Cluster compiles run at once: the setting, else one per core up to MAX_WORKERS, but one while this
    process builds the native op from source. Each compile is a C compiler process, so threads overlap
    them (the C generation between them holds the GIL: ~15 ms a cluster). Measured on the 2-core machine,
    the demo model's cold begin, runs alternated: with the op prebuilt, 1 worker 4.63 s, 2 workers 3.13 s
    (medians of 3); with the op built beside them, 1 worker 6.75 s, 2 workers 7.63 s: the op's build
    is then the longest path, and parallel compiles take its core."""
    if current.compile_workers:
        return current.compile_workers
    return 1 if building_op else max(1, min(MAX_WORKERS, os.cpu_count() or 1))


MAX_WORKERS = 4


@dataclass(frozen=True)
class _Build:
    index: int
    fingerprint: str
    site: Site
    backend: str
    plan: Any
    nodes: int
    profile: str  # what a probe finding is about, besides the fingerprint (verdict_keys)
    shapes: str
    placed: str = ""  # the TF device its ops run on (placement.Route.device): the GPU op's device


def _build(build: _Build, current: settings_module.Settings, fault: Fault | None, deadline: float) -> Any:
    """The cluster's ClusterKernel, "budget" when the compile budget is spent before it starts, or why it failed."""
    if time.perf_counter() > deadline:
        return "budget"
    try:
        plan = build.site.plan or build.plan
        return ClusterKernel(build.site.graph, plan, build.backend, current.cache_dir, fault, device=build.placed)
    except Exception as err:
        why = f"{build.backend} compile failed: {type(err).__name__}: {err}"
        log.warning("stitchfleet: cluster %d left to TF: %s", build.index, why)  # a warning: our failure, not the job's
        return why


def _compile_later(builds: list[_Build], cache_dir: Any) -> threading.Thread:
    """Compiles clusters past the budget into the kernel cache in the background (one at a time, beside the
    job's steps): the job's next pod, or the next job with the same clusters, finds them built."""

    def run() -> None:
        for build in builds:
            try:
                plan = build.site.plan or build.plan
                ClusterKernel(build.site.graph, plan, build.backend, cache_dir, device=build.placed)
            except Exception as err:  # the next pod compiles it again and records why it failed
                log.info("stitchfleet: background compile of cluster %d failed: %s", build.index, err)

    worker = threading.Thread(target=run, name="stitchfleet-compile-later", daemon=True)
    worker.start()
    return worker


def choose(
    graph: tf.Graph,
    conversion: Conversion,
    art: Artifacts,
    *,
    backend: str,
    known_bad: set[str],
    current: settings_module.Settings,
    fault: Fault | None = None,
    rank: int = 0,
    agreeing: bool = False,
    slower: Iterable[SlowerVerdict] = (),
    signature: Specialisation | None = None,
) -> Candidates:
    """Maps and builds every cluster of `art` (see the module docstring). Under a shape signature
    (`signature`), each mapped site learns which folded values it reads vary with the signature."""
    verdicts = {verdict.key: verdict for verdict in slower}
    recorded = setup_record.record_key(graph, backend, current)  # as built (Horovod's: with the agreement ops)
    building_op = False
    if current.bridge != "python" and targets.profile(backend).native_op:
        building_op = dispatch_op.warm(current.cache_dir)  # the op's build overlaps the cluster compiles below
    found = Candidates(recorded=recorded, building_op=building_op)
    path, read = training_path(graph), step_values(graph)
    routes = _router(backend, current)
    builds: list[_Build] = []
    if art.report is None:
        raise ValueError("artifacts without a compile report: choose reads each cluster's fingerprint from it")
    for i, (cg, plan, summary) in enumerate(zip(art.cluster_graphs, art.stitch, art.report.clusters, strict=True)):
        fingerprint = summary.fingerprint
        if isinstance(plan, Decision):
            found.left.append((i, fingerprint, plan.reason))
            continue
        if agreeing and i >= SLOTS:
            found.left.append((i, fingerprint, f"cluster {i} is past the {SLOTS} clusters Horovod ranks can agree on"))
            continue
        mapped = _mapped(graph, conversion, i, (cg, plan), path, routes=routes, read=read)
        if isinstance(mapped, str):
            found.left.append((i, fingerprint, mapped))
            continue
        site, site_backend, placed = mapped
        found.mapped.append(site)
        device, shapes = profile(site_backend, current.gpu_type), input_shapes(site.graph)
        verdict = verdicts.get((fingerprint, device, shapes))
        if verdict is not None:  # after mapping: the twin still copies what depends on it, as on every rank
            found.slower.append((i, fingerprint, verdict.reason))
            continue
        builds.append(_Build(i, fingerprint, site, site_backend, plan, len(cg.nodes), device, shapes, placed))
    _build_all(found, builds, known_bad, current, (fault, rank, building_op))
    # what the job's next run finds in the cache: its payback estimate then knows whether its setup is warm
    setup_record.write(current.cache_dir, recorded, backend, [cluster.kernel for cluster in found.clusters])
    found.left.sort(key=lambda left: left[0])
    if signature is not None:
        signature.mark(graph, conversion, found.mapped)
    if current.dump_dir:
        dump_changes(Path(current.dump_dir), found.mapped)
    return found


SITE_CHANGES = "sites.json"


def dump_changes(directory: Path, sites: Iterable[Site]) -> None:
    """Each mapped cluster's changes (`Site.changes`, empty when it kept the compiler's graph and plan)."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = [{"cluster": site.index, "changes": [d.to_json() for d in site.changes]} for site in sites]
    (directory / SITE_CHANGES).write_text(json.dumps(payload, indent=1))


def _build_all(
    found: Candidates,
    builds: list[_Build],
    known_bad: set[str],
    current: settings_module.Settings,
    context: tuple[Fault | None, int, bool],
) -> None:
    """Builds the mapped clusters, `compile_workers` at a time on backends with `parallel_builds`, within the compile
    budget; `context` is the test-only fault, this rank and whether the native op is being built beside them."""
    fault, rank, building_op = context
    parallel = all(targets.profile(b.backend).parallel_builds for b in builds)
    workers = compile_workers(current, building_op) if parallel else 1
    started = time.perf_counter()
    deadline = started + current.compile_budget

    def one(build: _Build) -> Any:
        injected = fault if fault is not None and fault.applies(build.index, rank) else None
        return _build(build, current, injected, deadline)

    if workers > 1 and len(builds) > 1:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stitchfleet-compile") as pool:
            results = list(pool.map(one, builds))
    else:
        results = [one(build) for build in builds]
    late: list[_Build] = []
    for build, kernel in zip(builds, results, strict=True):
        if kernel == "budget":
            late.append(build)
            reason = f"compile budget spent: {current.compile_budget:g} s of compiles in begin"
            reason += " (compiling it into the kernel cache for a later pod)"
            found.left.append((build.index, build.fingerprint, reason))
        elif isinstance(kernel, str):
            found.left.append((build.index, build.fingerprint, kernel))
        else:
            found.sites.append(build.site)
            enabled = build.fingerprint not in known_bad
            cluster = Cluster(build.index, build.fingerprint, kernel, build.nodes, enabled)
            cluster.profile, cluster.shapes = build.profile, build.shapes
            found.clusters.append(cluster)
            found.compiles.built += 1
            found.compiles.compiled += getattr(kernel.executable, "cached", True) is False
    found.compiles.seconds = time.perf_counter() - started if builds else 0.0
    found.compiles.over_budget, found.compiles.workers = len(late), workers
    if late:
        found.background = _compile_later(late, current.cache_dir)
