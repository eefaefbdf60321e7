"""CompileReport: everything the compiler decided about one graph, as plain data.

Input: built by the pipeline's `report` stage from the earlier artifacts. Output: a
frozen, JSON-serialisable record (round-trips through `to_json`/`from_json`) that the
plugin turns into telemetry and the CLI prints (`format_table`): the graph fingerprint,
clusters with sizes and fingerprints, excluded ops with reasons, decisions, kernel
counts per planner and cluster, modeled GPU time per planner, cluster and device (`gpu_time`: a model,
labelled so, never a measurement), and stage timings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from stitchfleet.compiler.decision import Decision, Exclusion
from stitchfleet.compiler.gpu_time import ModeledTime

FORMAT = "stitchfleet-compile-report"
VERSION = 1


class ReportFormatError(ValueError):
    """A JSON document is not a CompileReport this code can read."""


@dataclass(frozen=True)
class ClusterSummary:
    id: int
    size: int
    regions: int
    nodes: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    fingerprint: str


@dataclass(frozen=True)
class KernelCount:
    planner: str
    cluster: int
    kernels: int


@dataclass(frozen=True)
class StageTiming:
    stage: str
    seconds: float


@dataclass(frozen=True)
class CompileReport:
    graph_name: str
    graph_fingerprint: str
    node_count: int
    clusters: tuple[ClusterSummary, ...]
    excluded: tuple[Exclusion, ...]
    decisions: tuple[Decision, ...]
    kernel_counts: tuple[KernelCount, ...]
    timings: tuple[StageTiming, ...]
    modeled: tuple[ModeledTime, ...] = ()  # GPU time from gpu_time's model: never reported as measured

    def totals(self) -> dict[str, int]:
        """Kernels per planner over all clusters, planners in first-seen order."""
        totals: dict[str, int] = {}
        for count in self.kernel_counts:
            totals[count.planner] = totals.get(count.planner, 0) + count.kernels
        return totals

    def modeled_totals(self, device: str) -> dict[str, float]:
        """Modeled microseconds per planner over all clusters on `device` (h100, h200)."""
        totals: dict[str, float] = {}
        for m in self.modeled:
            if m.device == device:
                totals[m.planner] = round(totals.get(m.planner, 0.0) + m.microseconds, 3)
        return totals

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @classmethod
    def from_json(cls, doc: object) -> CompileReport:
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ReportFormatError(f"not a {FORMAT} version {VERSION} document")
        try:
            return _parse(doc)
        except (KeyError, TypeError) as err:
            raise ReportFormatError(f"malformed compile report: {err!r}") from None

    @classmethod
    def loads(cls, text: str) -> CompileReport:
        try:
            return cls.from_json(json.loads(text))
        except json.JSONDecodeError as err:
            raise ReportFormatError(f"not valid JSON: {err.msg} at line {err.lineno}") from None


def _tuples(record: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: tuple(v) if k in keys else v for k, v in record.items()}


def _parse(doc: Mapping[str, Any]) -> CompileReport:
    return CompileReport(
        graph_name=doc["graph_name"],
        graph_fingerprint=doc["graph_fingerprint"],
        node_count=doc["node_count"],
        clusters=tuple(ClusterSummary(**_tuples(c, "nodes", "inputs", "outputs")) for c in doc["clusters"]),
        excluded=tuple(Exclusion(**e) for e in doc["excluded"]),
        decisions=tuple(Decision(**d) for d in doc["decisions"]),
        kernel_counts=tuple(KernelCount(**k) for k in doc["kernel_counts"]),
        timings=tuple(StageTiming(**t) for t in doc["timings"]),
        modeled=tuple(ModeledTime(**m) for m in doc.get("modeled", ())),  # absent from older reports
    )


def _cluster_rows(report: CompileReport) -> list[str]:
    planners = list(report.totals())
    counts = {(k.planner, k.cluster): k.kernels for k in report.kernel_counts}
    header = f"{'cluster':>7} {'ops':>5} {'regions':>7} {'inputs':>6} {'outputs':>7}  " + " ".join(
        f"{p:>10}" for p in planners
    )
    rows = [header]
    for c in report.clusters:
        kernels = " ".join(f"{counts.get((p, c.id), 0):>10}" for p in planners)
        rows.append(f"{c.id:>7} {c.size:>5} {c.regions:>7} {len(c.inputs):>6} {len(c.outputs):>7}  {kernels}")
    totals = " ".join(f"{n:>10}" for n in report.totals().values())
    rows.append(f"{'total':>7} {sum(c.size for c in report.clusters):>5} {'':>7} {'':>6} {'':>7}  {totals}")
    return rows


def format_table(report: CompileReport) -> str:
    """A readable summary: clusters and kernel counts, exclusions with reasons, timings."""
    lines = [
        f"graph {report.graph_name or '(unnamed)'}  fingerprint {report.graph_fingerprint}  nodes {report.node_count}",
        "",
        f"clusters: {len(report.clusters)}",
        *_cluster_rows(report),
        "",
        f"excluded ops: {len(report.excluded)}",
    ]
    lines += [f"  node {e.node:>5} {e.op:<14} {e.name:<32} {e.reason}" for e in report.excluded]
    for device in dict.fromkeys(m.device for m in report.modeled):
        totals = "  ".join(f"{planner} {us:.1f}" for planner, us in report.modeled_totals(device).items())
        lines += [
            "",
            f"modeled GPU time on {device} (a model, not a measurement; docs/gpu_time_model.md), us: {totals}",
        ]
    lines += ["", "stage timings:"]
    lines += [f"  {t.stage:<16} {t.seconds * 1000:9.2f} ms" for t in report.timings]
    return "\n".join(lines) + "\n"
