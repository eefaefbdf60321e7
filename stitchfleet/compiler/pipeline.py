"""The compiler's stages, listed once, in data-flow order: graph -> clusters -> op clusters -> plans -> kernel
IR -> rendered sources -> report.

Input: a `Graph` and `Options` (remote stitch budget, dump directory: the caller
reads them from settings; the frontend's op origins, from a frontend that lowers one op
into several nodes). Output: `Artifacts`, every stage's product; `.report` is
the `CompileReport`. Each stage is a function named by the artifact it produces and
reads only earlier artifacts; `STAGES` is the one list that orders them. With a dump
directory, every artifact is written there as JSON (`NN_<artifact>.json`, clusters
also as standalone IR graphs). `op_clusters` redraws the scope pass's clusters along whole
frontend ops (`granularity.redraw`; the same clusters without origins), so every later
stage, and the plugin, sees clusters the frontend's framework can compute. The `stitch`
stage plans every cluster graph once, for the options' device (a cluster the planner or
`op_clusters` refuses keeps its original ops, with the reason). `compile_cluster` is the
one re-entry for a cluster graph changed after the pipeline ran (the plugin's TF reasons):
callers outside the compiler plan through it, never through the planner. The back stages run
when asked (`Options.kernels`, `Options.sources`; `stitchfleet compile` and the hook ask when they
dump): `kernels` lowers every plan to kernel IR once (what sim, cuda and cuda-cpu run), `sources`
renders the named targets' source text (`cuda` from that kernel IR, `cpu` C from the plan); a
cluster either refuses keeps a Decision with the reason in its place.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitchfleet.compiler import gpu_time, granularity, ir, targets
from stitchfleet.compiler.baselines import PLANNERS, Plan
from stitchfleet.compiler.decision import Decision
from stitchfleet.compiler.gpu_time import ModeledTime
from stitchfleet.compiler.kernel.printer import print_kernel
from stitchfleet.compiler.lower import Lowered, lower
from stitchfleet.compiler.plan import PlanOptions, StitchPlan, plan_cluster
from stitchfleet.compiler.report import ClusterSummary, CompileReport, KernelCount, StageTiming
from stitchfleet.compiler.scope import Cluster, Scope, find_clusters
from stitchfleet.compiler.subgraph import extract


@dataclass(frozen=True)
class Options:
    remote_budget: int = 8
    dump_dir: Path | None = None
    plan: PlanOptions = dataclasses.field(default_factory=PlanOptions)
    # The baseline planners whose kernel counts the report holds; a job's hook asks only per_op (the
    # count a refused cluster keeps): xla_style is for `stitchfleet compile` and cost ~0.4 s of setup.
    baselines: tuple[str, ...] = ("per_op", "xla_style")
    # IR nodes holding a whole frontend op's output (the TF frontend's `origins`); None: every node is
    # one op of its own (a graph from JSON), so `op_clusters` keeps the scope pass's clusters.
    origins: frozenset[int] | None = None
    # Nodes the scope pass keeps out of every cluster, each with its reason (node id -> reason): the
    # frontend's epilogues that the target's TF library fuses with their compute op (`Profile.library_fusions`).
    held: Mapping[int, str] = dataclasses.field(default_factory=dict)
    # The back stages run only when asked: a job's hook builds each cluster for its backend itself and
    # would pay them in its setup. `sources` names targets (SOURCE_TARGETS); cuda renders the kernel IR.
    kernels: bool = False
    sources: tuple[str, ...] = ()
    # The report's modeled GPU times (`gpu_time`): `stitchfleet compile` and the benchmarks read them; a job's
    # hook does not (each cluster's traffic priced per device: ~5-10 ms of the demo model's setup).
    modeled: bool = True

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sources) - set(SOURCE_TARGETS))
        if unknown:
            raise ValueError(f"no source renderer for {unknown} (renderers: {', '.join(SOURCE_TARGETS)})")
        from_kernels = [name for name in self.sources if targets.profile(name).source_from == "kernels"]
        if from_kernels and not self.kernels:
            raise ValueError(f"{', '.join(from_kernels)} sources are rendered from the kernel IR: ask for kernels too")


SOURCE_TARGETS = targets.names(with_sources=True)  # what the `sources` stage can render; callers that dump ask for all


@dataclass(frozen=True)
class RenderedSource:
    """One cluster's source text for one target."""

    cluster: int
    target: str
    text: str

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Artifacts:
    """Products of the stages so far; a stage fills one field."""

    graph: ir.Graph
    clusters: Scope | None = None
    op_clusters: Scope | None = None
    cluster_graphs: tuple[ir.Graph, ...] = ()
    baseline_plans: tuple[Plan, ...] = ()
    stitch: tuple[StitchPlan | Decision, ...] = ()
    kernels: tuple[Lowered | Decision, ...] = ()
    sources: tuple[RenderedSource | Decision, ...] = ()
    report: CompileReport | None = None
    timings: tuple[StageTiming, ...] = ()

    def need_clusters(self) -> Scope:
        """The clusters every later stage compiles: the op-granularity ones."""
        if self.op_clusters is None:
            raise RuntimeError("the op_clusters stage has not run")
        return self.op_clusters


def clusters(art: Artifacts, options: Options) -> Scope:
    return find_clusters(art.graph, options.remote_budget, options.held)


def op_clusters(art: Artifacts, options: Options) -> Scope:
    if art.clusters is None:
        raise RuntimeError("the clusters stage has not run")
    if options.origins is None:
        return art.clusters
    return granularity.redraw(art.graph, options.origins, art.clusters)


def cluster_graphs(art: Artifacts, options: Options) -> tuple[ir.Graph, ...]:
    """Each cluster as a standalone graph; one the op_clusters stage redrew is marked `regrouped`."""
    graph, drawn = art.graph, art.clusters.clusters if art.clusters is not None else ()
    return tuple(
        extract(graph, c.nodes).with_metadata(cluster=c.id, **({"regrouped": True} if c.nodes != d.nodes else {}))
        for c, d in zip(art.need_clusters().clusters, drawn, strict=True)
    )


def baseline_plans(art: Artifacts, options: Options) -> tuple[Plan, ...]:
    chosen = [PLANNERS[name] for name in options.baselines]
    return tuple(plan(art.graph, c) for c in art.need_clusters().clusters for plan in chosen)


def compile_cluster(graph: ir.Graph, cluster: int, options: PlanOptions) -> StitchPlan:
    """The plan of one cluster graph (ValueError with the planner's reason when it refuses it): the
    `stitch` stage's step, and the one re-entry for a cluster graph changed after the pipeline ran
    (the plugin's interior outputs and inputs, cycles through outside TF ops, whose reasons the plugin
    keeps as decisions; a test fault's corrupted graph). Nothing outside the compiler plans otherwise."""
    return plan_cluster(graph, cluster, options)


def _plan_or_refusal(graph: ir.Graph, cluster: int, options: PlanOptions) -> StitchPlan | Decision:
    try:
        return compile_cluster(graph, cluster, options)
    except ValueError as err:
        return Decision("stitch", "refuse", f"cluster {cluster}", f"not stitched, keeps its original ops: {err}")


def stitch(art: Artifacts, options: Options) -> tuple[StitchPlan | Decision, ...]:
    """A StitchPlan per cluster graph, or the Decision saying why it was refused (planned once)."""
    return tuple(
        Decision(granularity.STAGE, "refuse", f"cluster {c.id}", c.refused)  # the op_clusters stage's own
        if c.refused
        else _plan_or_refusal(g, c.id, options.plan)
        for c, g in zip(art.need_clusters().clusters, art.cluster_graphs, strict=True)
    )


# What a lowering or a renderer raises for a cluster it cannot express (RenderError and the kernel
# verifier's errors are ValueErrors): the cluster keeps a Decision, the other clusters go on.
_CANNOT = (NotImplementedError, ValueError, RuntimeError)


def _lowered(graph: ir.Graph, plan: StitchPlan | Decision) -> Lowered | Decision:
    if isinstance(plan, Decision):
        return plan
    try:
        return lower(graph, plan)
    except _CANNOT as err:
        return Decision("kernels", "refuse", f"cluster {plan.cluster}", f"not lowered: {err}")


def kernels(art: Artifacts, options: Options) -> tuple[Lowered | Decision, ...]:
    """Kernel IR per cluster (empty unless `options.kernels`), or the Decision saying why there is none."""
    if not options.kernels:
        return ()
    return tuple(_lowered(g, p) for g, p in zip(art.cluster_graphs, art.stitch, strict=True))


def _rendered(target: str, graph: ir.Graph, plan: StitchPlan | Decision, lowered: object) -> RenderedSource | Decision:
    if isinstance(plan, Decision):
        return plan
    if targets.profile(target).source_from == "kernels" and isinstance(lowered, Decision):
        return lowered  # no kernel IR, no text from it (cpu C is rendered from the plan and still comes)
    try:
        low = lowered if isinstance(lowered, Lowered) else None
        text = targets.render_source(target, plan.cluster, graph, plan, low)
    except _CANNOT as err:
        return Decision("sources", "refuse", f"cluster {plan.cluster} {target}", f"not rendered: {err}")
    return RenderedSource(plan.cluster, target, text)


def sources(art: Artifacts, options: Options) -> tuple[RenderedSource | Decision, ...]:
    """Per cluster, per target of `options.sources` (in that order), its source text or why there is none."""
    lowered: tuple[object, ...] = art.kernels or (None,) * len(art.stitch)
    return tuple(
        _rendered(target, g, p, low)
        for g, p, low in zip(art.cluster_graphs, art.stitch, lowered, strict=True)
        for target in options.sources
    )


def _stitch_counts(art: Artifacts) -> tuple[KernelCount, ...]:
    per_op = {p.cluster: p.kernel_count for p in art.baseline_plans if p.planner == "per_op"}
    return tuple(
        KernelCount("stitch", c.id, p.kernel_count if isinstance(p, StitchPlan) else per_op[c.id])
        for c, p in zip(art.need_clusters().clusters, art.stitch, strict=True)
    )


def _stitch_decisions(art: Artifacts) -> tuple[Decision, ...]:
    out: list[Decision] = []
    for p in art.stitch:
        if isinstance(p, Decision):
            out += [p] if p.stage == "stitch" else []  # an op_clusters refusal is in the scope's decisions
            continue
        out += [Decision("stitch", c.action, f"cluster {p.cluster} {c.subject}", c.reason) for c in p.choices]
    return tuple(out)


def _back_decisions(art: Artifacts) -> tuple[Decision, ...]:
    """The back stages' own refusals, once each (a refused cluster passes an earlier stage's Decision on)."""
    back = (d for d in (*art.kernels, *art.sources) if isinstance(d, Decision) and d.stage in ("kernels", "sources"))
    return tuple(dict.fromkeys(back))


def _fingerprint(art: Artifacts, graph: ir.Graph, drawn: Cluster) -> str:
    """A cluster's key in the fleet's memory (reverted clusters, slower verdicts): the fingerprint of the
    cluster as the scope pass drew it. The redrawing is a function of that cluster and the origins, and
    the plugin redrew after the pipeline before it moved here: keys recorded then still name the cluster."""
    if not graph.metadata.get("regrouped"):
        return ir.fingerprint(graph)
    return ir.fingerprint(extract(art.graph, drawn.nodes))


def _modeled(art: Artifacts) -> tuple[ModeledTime, ...]:
    """Each planner's kernels of each cluster priced by the GPU time model; a refused cluster keeps per_op's."""
    traffic = {(p.planner, p.cluster): gpu_time.baseline_traffic(art.graph, p) for p in art.baseline_plans}
    for c, g, p in zip(art.need_clusters().clusters, art.cluster_graphs, art.stitch, strict=True):
        if isinstance(p, StitchPlan):
            traffic["stitch", c.id] = gpu_time.stitch_traffic(g, p)
        elif ("per_op", c.id) in traffic:
            traffic["stitch", c.id] = traffic["per_op", c.id]
    return tuple(
        gpu_time.total(planner, cluster, kernels, cost)
        for cost in gpu_time.COSTS.values()
        for (planner, cluster), kernels in traffic.items()
    )


def report(art: Artifacts, options: Options) -> CompileReport:
    scope, drawn = art.need_clusters(), art.clusters.clusters if art.clusters is not None else ()
    summaries = tuple(
        ClusterSummary(c.id, c.size, len(c.parts), c.nodes, c.inputs, c.outputs, _fingerprint(art, g, d))
        for c, g, d in zip(scope.clusters, art.cluster_graphs, drawn, strict=True)
    )
    return CompileReport(
        graph_name=str(art.graph.metadata.get("case", art.graph.metadata.get("name", ""))),
        graph_fingerprint=ir.fingerprint(art.graph),
        node_count=len(art.graph.nodes),
        clusters=summaries,
        excluded=scope.excluded,
        decisions=scope.decisions + _stitch_decisions(art) + _back_decisions(art),
        kernel_counts=tuple(KernelCount(p.planner, p.cluster, p.kernel_count) for p in art.baseline_plans)
        + _stitch_counts(art),
        timings=art.timings,
        modeled=_modeled(art) if options.modeled else (),
    )


def _dump_scope(scope: Scope) -> object:
    return {
        "clusters": [dataclasses.asdict(c) for c in scope.clusters],
        "excluded": [e.to_json() for e in scope.excluded],
        "decisions": [d.to_json() for d in scope.decisions],
    }


def _dump_kernels(programs: tuple[Lowered | Decision, ...]) -> object:
    return [
        p.to_json()
        if isinstance(p, Decision)
        else {"inputs": p.inputs, "outputs": p.outputs, "kernels": [print_kernel(k) for k in p.kernels]}
        for p in programs
    ]


def _dump_plans(plans: tuple[Plan, ...]) -> object:
    return [{"planner": p.planner, "cluster": p.cluster, "kernels": [k.to_json() for k in p.kernels]} for p in plans]


@dataclass(frozen=True)
class Stage:
    artifact: str
    produce: Callable[[Artifacts, Options], object]
    dump: Callable[[object], object]


STAGES: tuple[Stage, ...] = (
    Stage("clusters", clusters, _dump_scope),  # type: ignore[arg-type]
    Stage("op_clusters", op_clusters, _dump_scope),  # type: ignore[arg-type]
    Stage("cluster_graphs", cluster_graphs, lambda gs: [ir.to_json(g) for g in gs]),  # type: ignore[attr-defined]
    Stage("baseline_plans", baseline_plans, _dump_plans),  # type: ignore[arg-type]
    Stage("stitch", stitch, lambda ps: [p.to_json() for p in ps]),  # type: ignore[attr-defined]
    Stage("kernels", kernels, _dump_kernels),  # type: ignore[arg-type]
    Stage("sources", sources, lambda ss: [s.to_json() for s in ss]),  # type: ignore[attr-defined]
    Stage("report", report, lambda r: r.to_json()),  # type: ignore[attr-defined]
)


def _dump(directory: Path, index: int, name: str, payload: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{index:02d}_{name}.json").write_text(json.dumps(payload, indent=1))


def compile_graph(graph: ir.Graph, options: Options | None = None) -> Artifacts:
    """Runs every stage in order; returns all artifacts (the report last)."""
    opts = options or Options()
    art = Artifacts(graph)
    if opts.dump_dir is not None:
        _dump(opts.dump_dir, 0, "graph", ir.to_json(graph))
    for index, stage in enumerate(STAGES, start=1):
        started = time.perf_counter()
        product = stage.produce(art, opts)
        timing = StageTiming(stage.artifact, time.perf_counter() - started)
        changes: dict[str, Any] = {stage.artifact: product, "timings": (*art.timings, timing)}
        art = dataclasses.replace(art, **changes)
        if opts.dump_dir is not None:
            _dump(opts.dump_dir, index, stage.artifact, stage.dump(product))
    return art
