"""What the probes ask of a job's kernels per shape signature: which signature a step measured, a kernel's
shapes, and a kernel withdrawn where its probe found it slower than TF's ops.

The rules in full: docs/plugin/shapes.md.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stitchfleet.compiler.ir import Graph
from stitchfleet.plugin.control.signature_decisions import Allowed, slot_of
from stitchfleet.plugin.fleet.verdict_keys import input_shapes
from stitchfleet.plugin.shapes.signatures import SHAPE_EVENT, Signature

if TYPE_CHECKING:
    from stitchfleet.plugin.fleet.ledger import Ledger
    from stitchfleet.plugin.native.dispatch_op import BridgeOp
    from stitchfleet.telemetry.slow_verdicts import SlowerVerdict

log = logging.getLogger("stitchfleet.plugin")
SEEN, COMPILING, BOUND, LEFT, OVER = "seen", "compiling", "bound", "left", "over"


@dataclass
class Entry:
    """One signature the job fed: its recent training steps, what it has (`state`), its kernels' IR."""

    signature: Signature
    steps: deque[int] = field(default_factory=lambda: deque(maxlen=1))
    state: str = SEEN
    graphs: dict[int, Graph] = field(default_factory=dict)  # cluster index -> IR of the kernel serving it
    # cluster index -> the key its kernel is bound under ("": begin's): a cluster whose inputs have the same
    # shapes under two signatures (e.g. an optimizer's update of the weights) runs one kernel for both
    owners: dict[int, str] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True)
class Withdrawn:
    """Why a kernel is not bound again for its input shapes in this job (a fleet verdict's `reason`, locally)."""

    reason: str


class SignatureProbes:
    """See the module docstring. Held by `SignatureKernels`, whose tables it reads and updates (the same objects)."""

    def __init__(
        self,
        *,
        entries: dict[str, Entry],
        order: list[int],
        symbols: dict[int, str],
        served: dict[int, dict[tuple[tuple[int, ...], ...], str]],
        keys: dict[int, tuple[str, str]],
        unjudged: set[tuple[int, str]],
        bridge: BridgeOp,
        ledger: Ledger,
        slower: dict[tuple[str, str, str], SlowerVerdict | Withdrawn],
    ) -> None:
        self.entries, self.order, self.symbols, self.served = entries, order, symbols, served
        self.keys, self.unjudged, self.bridge, self.ledger = keys, unjudged, bridge, ledger
        self.slower = slower  # (fingerprint, profile, shapes) -> a verdict with a `reason`; withdrawals join it
        self.only: dict[int, Allowed] = {}  # cluster index -> the signatures it may have kernels for; else any

    def measured(
        self, signature: Signature | None, switches: Iterable[bool]
    ) -> tuple[str | None, tuple[int, ...], str | None]:
        """The step's (`signature`) key and the switched-on clusters (controller positions) on TF's ops for it for good
        (a settled signature: left, over, withheld, unbound), the key None while its kernels are to come
        (docstring); then the step's signature key whatever its kernels (None when unknown: `StepFigures`)."""
        step = signature.key if signature is not None else None
        entry = self.entries.get(step) if step is not None else None
        on = [k for k, switch in enumerate(switches) if switch]
        if entry is None or (entry.state in (SEEN, COMPILING) and on):
            return None, (), step
        return entry.signature.key, tuple(k for k in on if self.order[k] not in entry.graphs), step

    def shapes_of(self, index: int, key: str) -> str | None:
        """The inputs' shapes (`verdict_keys.input_shapes`) of cluster `index`'s kernel for signature `key`;
        None without one."""
        entry = self.entries.get(key)
        graph = entry.graphs.get(index) if entry is not None else None
        return input_shapes(graph) if graph is not None else None

    def withdraw(self, index: int, key: str, reason: str, step: int) -> bool:
        """Unbinds cluster `index`'s kernel for signature `key` (module docstring); False when it has none bound."""
        entry = self.entries.get(key)
        symbol = self.symbols.get(index)
        if entry is None or index not in entry.graphs or not symbol:
            return False
        owner, graph = entry.owners.get(index, ""), entry.graphs[index]
        if not self.bridge.unbind(symbol, owner):
            return False
        sharing = [e for e in self.entries.values() if e.owners.get(index) == owner and index in e.graphs]
        for each in sharing:
            del each.graphs[index], each.owners[index]
        self.served[index] = {shapes: k for shapes, k in self.served.get(index, {}).items() if k != owner}
        self.unjudged.discard((index, owner))
        self.slower[(*self.keys[index], input_shapes(graph))] = Withdrawn(reason)
        keys = " and ".join(e.signature.key for e in sharing)
        detail = f"cluster {index}, {keys}: {reason}"
        log.info("stitchfleet: kernel withdrawn: %s", detail)
        self.ledger.event(SHAPE_EVENT, step, None, "withdrawn", detail=detail[:1000])
        return True

    def restrict(self, index: int, allowed: Allowed, reason: str, step: int) -> list[str]:
        """Keeps cluster `index`'s kernels for the signatures `allowed` names (their `slot_of`) only: the others'
        are withdrawn, and no kernel is bound for it at another signature again (`allows`). A kernel an allowed
        signature shares stays: it is the same code at the same input shapes. Returns the signatures withdrawn."""
        self.only[index] = allowed
        mine = [(key, e) for key, e in self.entries.items() if index in e.graphs]
        kept = {e.owners.get(index, "") for key, e in mine if slot_of(key) in allowed}
        withdrawn = []
        for key, entry in mine:
            if index not in entry.graphs or slot_of(key) in allowed or entry.owners.get(index, "") in kept:
                continue  # withdrawn with a signature sharing its kernel already, allowed, or sharing an allowed one
            if self.withdraw(index, key, reason, step):
                withdrawn.append(key)
        return withdrawn

    def allows(self, index: int, key: str) -> bool:
        """Whether cluster `index` may get a kernel for signature `key` (`restrict`)."""
        allowed = self.only.get(index)
        return allowed is None or slot_of(key) in allowed
