"""Whether the fleet already knows that stitching loses on this job's graph, and what this job adds to that memory.

Input: the job's TF graph, its backend and device profile, the fleet's `Recollection`, and at the job's end how its
stitching ended (`JobCourse`, the group's decision). Output: the job's key in the fleet's memory, the slower verdict
that lets a later run of the same graph skip setup altogether, and the finding this job records. Rules in full:
docs/plugin/setup.md ("A job the fleet knows loses").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stitchfleet.plugin.fleet.fleet_memory import Recollection
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.fleet.verdict_keys import profile
from stitchfleet.plugin.graph.graph_identity import graph_key
from stitchfleet.telemetry.kinds import ProbeOutcome
from stitchfleet.telemetry.slow_verdicts import SlowerVerdict

if TYPE_CHECKING:  # the hook recalls a verdict before any setup import: the job's course only types here
    import tensorflow as tf

    from stitchfleet.plugin.control.job_course import JobCourse

PREFIX = "job:"  # beside a cluster's fingerprint and a group's "group:" in the same table
SHAPES = "the job's graph"  # the graph key holds its placeholders' static shapes already


def job_key(graph: tf.Graph, backend: str, declared_gpu: str = "") -> tuple[str, str, str]:
    """The job's key (fingerprint, profile, shapes) in the fleet's memory: its graph's identity across runs
    (`graph_identity.graph_key`: seeds and function counters left out) on this device profile."""
    return f"{PREFIX}{graph_key(graph)[:24]}", profile(backend, declared_gpu), SHAPES


def recall(
    graph: tf.Graph, backend: str, declared_gpu: str, ranks: int, memory: Recollection
) -> tuple[tuple[str, str, str] | None, SlowerVerdict | None]:
    """The job's key and the fleet's slower verdict on it (enough earlier jobs found stitching lose on its graph,
    and no later one found it faster: `slow_verdicts.derive`'s mirror rule), or None. A Horovod job (`ranks` > 1)
    has neither: its ranks may recall different memories, so they set up and agree as before."""
    if ranks != 1:
        return None, None
    key = job_key(graph, backend, declared_gpu)
    return key, next((verdict for verdict in memory.slower if verdict.key == key), None)


def finding(course: JobCourse, group_proven: bool | None, group: ProbeOutcome | None = None) -> tuple[str, str] | None:
    """What the job's end says about stitching on its graph, as (outcome, reason), or None: nothing about speed
    (docs/plugin/setup.md). Slower: the group's own finding for the fleet was (`group`: `ProbeDecisions.group_finding`)
    and stitching went off, or the slowdown guard reverted the job. Faster: the group was proven faster and the job
    ended with clusters kept and on, nothing reverting it."""
    reverted = course.job_reverted
    if reverted is not None:
        return (ProbeOutcome.SLOWER, reverted) if reverted.startswith("slowdown:") else None
    if course.stitching_off is not None:
        return (ProbeOutcome.SLOWER, course.stitching_off) if group == ProbeOutcome.SLOWER else None
    if group_proven and any(c.enabled and c.kept for c in course.clusters):
        return ProbeOutcome.FASTER, "group proven faster, clusters kept to the job's end"
    return None  # no probe measured the job's step (probes off, or per-cluster only): nothing about the graph


def record(
    ledger: Ledger, key: tuple[str, str, str], course: JobCourse, proven: bool | None, group: ProbeOutcome | None = None
) -> None:
    """The job's finding on its graph, for the fleet's memory (`Ledger.probed`), when it has one (`finding`)."""
    found = finding(course, proven, group)
    if found is not None:
        outcome, reason = found
        ledger.probed(*key, outcome, f"job: {reason}")
