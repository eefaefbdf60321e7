"""Records of what the compiler decided and why: kept in every report, never logged.

Input: made by the stages (scope, planners). Output: frozen, JSON-ready records.
`Exclusion` says why a node is in no cluster; `Decision` is any other choice a stage
made (a merge refused, a remote stitch, a kernel boundary) with its reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from stitchfleet.compiler.ir import Node


@dataclass(frozen=True)
class Exclusion:
    """A node left out of every cluster."""

    node: int
    name: str
    op: str
    reason: str

    @classmethod
    def of(cls, node: Node, reason: str) -> Exclusion:
        return cls(node.id, node.name, node.op.value, reason)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    """One choice of one stage: what was done to which subject, and why."""

    stage: str
    action: str
    subject: str
    reason: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)
