"""Kernels per shape signature: which signatures a job's clusters get native kernels for, and when.

The rules in full: docs/plugin/shapes.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stitchfleet import settings as settings_module
from stitchfleet.compiler.ir import Graph
from stitchfleet.plugin.fleet.verdict_keys import input_shapes
from stitchfleet.plugin.graph.mapping import Site
from stitchfleet.plugin.guard.numeric import Finding
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.shapes.rebinding import Built, build, inputs, symbol
from stitchfleet.plugin.shapes.signature_probes import BOUND, COMPILING, LEFT, OVER, SEEN, Entry, SignatureProbes
from stitchfleet.plugin.shapes.signatures import SHAPE_EVENT, Signature, Specialisation, observed

if TYPE_CHECKING:
    from stitchfleet.plugin.control.cluster import Cluster
    from stitchfleet.plugin.fleet.ledger import Ledger
    from stitchfleet.plugin.graph.rewrite import Installed
    from stitchfleet.plugin.graph.twin import Feeds
    from stitchfleet.plugin.native.dispatch_op import BridgeOp

log = logging.getLogger("stitchfleet.plugin")
TRACKED = 256  # signatures followed at most: a job feeding ever new shapes is not remembered without end


@dataclass(frozen=True)
class Job:
    """What the kernels of a job's signatures need of it: the bridge op, settings, ledger, the test-only fault
    and this rank."""

    bridge: BridgeOp
    current: settings_module.Settings
    ledger: Ledger
    fault: tuple[Fault, int] | None = None

    @property
    def parts(self) -> tuple[BridgeOp, settings_module.Settings, Ledger, tuple[Fault, int] | None]:
        return self.bridge, self.current, self.ledger, self.fault


class SignatureKernels:
    """See the module docstring."""

    def __init__(
        self,
        shapes: Specialisation,
        installed: Sequence[tuple[Cluster, Installed]],
        originals: dict[int, Site],
        job: Job,
    ) -> None:
        self.shapes, self.bridge, self.current, self.ledger, self.fault = shapes, *job.parts
        self.clusters = [(cluster, originals[cluster.index]) for cluster, _ in installed]
        self.order = [cluster.index for cluster, _ in installed]  # controller position -> cluster index
        self.unjudged: set[tuple[int, str]] = set()  # (cluster index, key) of kernels bound here, not judged yet
        self.guesses = 0  # `tf.data` steps in a row that judged fresh clusters and met none of their kernels
        self.symbols = {c.index: symbol(c) for c, _ in installed}
        recalled = getattr(self.ledger, "recollection", None)  # the fleet's slower verdicts begin read
        self.slower = {v.key: v for v in (recalled.slower if recalled is not None else ())}
        self.keys = {c.index: (c.fingerprint, c.profile) for c, _ in installed}  # a verdict's key, but the shapes
        for entry in filter(None, self.symbols.values()):  # not an earlier session's kernels, unguarded here
            self.bridge.reset(entry)
        self.entries: dict[str, Entry] = {}
        self.base = shapes.signature
        if self.base is not None:  # begin's kernels: the IR each was installed with
            base = Entry(self.base, deque(maxlen=self.current.signature_steps), BOUND)
            base.graphs = {c.index: done.site.graph for c, done in installed}
            base.owners = dict.fromkeys(base.graphs, "")
            self.entries[self.base.key] = base
        # per cluster index: input shapes -> the key of the kernel bound for them ("": begin's)
        self.served: dict[int, dict[tuple[tuple[int, ...], ...], str]] = {
            c.index: {inputs(c.kernel.executable): ""}
            for c, _ in installed
            if symbol(c) and c.kernel.executable is not None  # a symbol means a native kernel
        }
        self.guessed = shapes.guessed  # begin's signature takes a place under the bound only once fed
        self.over = 0  # training steps whose signature had no kernel and will get none (past the bound)
        self.lost: set[int] = set()  # clusters that lost a signature's kernel to the guard
        self.queue: list[Entry] = []
        self.running: tuple[Entry, threading.Thread, float] | None = None
        self.results: dict[str, Built] = {}  # written by the compile thread, read under the lock
        self.lock = threading.Lock()
        self.signature: Signature | None = None  # the signature of the training step under way (the guard's)
        self.feeds: Any = None  # that step's feeds ({} when none), until its iterator's reads are known (`after`)
        self.probes = SignatureProbes(
            entries=self.entries,
            order=self.order,
            symbols=self.symbols,
            served=self.served,
            keys=self.keys,
            unjudged=self.unjudged,
            bridge=self.bridge,
            ledger=self.ledger,
            slower=self.slower,
        )

    # --- per training step (the hook, before the step runs) -------------------------------------------

    def before(self, feed_dict: Feeds | None, step: int) -> float:
        """A training step about to run: binds what finished compiling; its signature when its feeds give it all
        (no iterator among the sources), booked (`observe`). Returns the compile seconds booked now."""
        booked = self.poll()
        self.signature, self.feeds = None, feed_dict or {}
        if not self.shapes.read:
            self.signature = observed(self.shapes.sources, feed_dict)
            self.observe(self.signature, step)
        return booked

    @property
    def reading(self) -> bool:
        """Whether the step under way must fetch its iterator's read shapes (`Specialisation.fetches`)."""
        return bool(self.shapes.read) and self.feeds is not None

    def after(self, read: Sequence[Iterable[int]] | None, step: int) -> None:
        """The step ran: with an iterator among the sources, its signature from the shapes its reads had (`read`:
        the fetched `Specialisation.fetches`, None when not fetched), learnt and booked (`observe`)."""
        if not self.reading:
            return
        names = [t.name for t in self.shapes.read]
        shapes = dict(zip(names, (tuple(v) for v in read), strict=True)) if read is not None else None
        self.signature = observed(self.shapes.sources, self.feeds, shapes) if shapes is not None else None
        self.feeds = None
        if self.signature is not None:
            self.shapes.learned(self.signature)
        self.observe(self.signature, step)

    def observe(self, signature: Signature | None, step: int) -> None:
        """Books a training step that gave `signature` (None: not all sources known) and queues its compile
        when it is due."""
        if signature is None:
            return
        entry = self.entries.get(signature.key) or self._entry(signature)
        if entry is None:
            self.over += 1
            return
        entry.steps.append(step)
        if entry is self.entries.get(self.base.key if self.base else "") and self.guessed:
            self.guessed = False  # the guess was right: begin's kernels now count under the bound
        due = len(entry.steps) == self.current.signature_steps
        if entry.state == SEEN and due and entry.steps[-1] - entry.steps[0] < self.current.signature_window:
            if self.kernels() >= self.current.signatures_max:
                entry.state = OVER
                detail = f"{signature.key}: {self.kernels()} signature(s) have kernels (STITCHFLEET_SIGNATURES_MAX)"
                self.ledger.event(SHAPE_EVENT, step, None, "over the bound", detail=detail)
            else:
                entry.state = COMPILING
                self.queue.append(entry)
                self._start_next()
        if entry.state == OVER:
            self.over += 1

    def kernels(self) -> int:
        """Signatures with kernels or compiling them (begin's guess only once the job fed it)."""
        base = self.base.key if self.base is not None and self.guessed else None
        return sum(e.state in (BOUND, COMPILING) and key != base for key, e in self.entries.items())

    def poll(self) -> float:
        """Binds the kernels of a finished compile and starts the next; a compile past its time is given up."""
        booked = 0.0
        if self.running is not None:
            entry, thread, started = self.running
            # read before the results: a thread that has ended wrote its result before (no race with its end)
            alive, built = thread.is_alive(), None
            looked = self.lock.acquire(blocking=False)  # the step never waits on the compile thread
            if looked:
                try:
                    built = self.results.pop(entry.signature.key, None)
                finally:
                    self.lock.release()
            if built is not None:
                self.running = None
                booked = built.seconds
                self._bind(entry, built)
            elif time.monotonic() - started > self.current.signature_compile_seconds:
                self.running = None  # the thread is left to finish alone; its result is dropped
                self._left(entry, f"its compile took longer than {self.current.signature_compile_seconds:.0f} s")
            elif looked and not alive:  # ended without a result: `build` never raises, but say so
                self.running = None
                self._left(entry, "its compile ended without a result")
        self._start_next()
        return booked

    def wait(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for every compile under way or queued; True when none is left (their
        kernels are bound by the next `observe`, or here). For scripts and tests that want it settled."""
        deadline = time.monotonic() + timeout
        while self.running is not None and time.monotonic() < deadline:
            self.running[1].join(max(min(deadline - time.monotonic(), 0.5), 0.0))
            self.poll()
        return self.running is None and not self.queue

    # --- the guard ------------------------------------------------------------------------------------

    def graph(self, index: int) -> Graph | None:
        """The IR of the kernel that ran cluster `index` at the step under way (`signature`; begin's when none is
        bound for it: the guard then sees inputs of another shape and that TF's ops ran)."""
        signature = self.signature
        entry = self.entries.get(signature.key) if signature is not None else None
        if entry is not None and index in entry.graphs:
            return entry.graphs[index]
        base = self.entries.get(self.base.key) if self.base is not None else None
        return base.graphs.get(index) if base is not None else None

    def mismatch(self, index: int, signature: Signature | None, finding: Finding, step: int) -> bool:
        """Unbinds the kernel of cluster `index` for `signature` after the guard found it wrong, when that is
        safe (module docstring); False when the cluster must revert instead (the controller's part)."""
        entry = self.entries.get(signature.key) if signature is not None else None
        owner = entry.owners.get(index, "") if entry is not None else ""
        if entry is None or index not in entry.graphs or not owner or index in self.lost:
            return False  # begin's kernel (or none): the controller reverts the cluster
        if not self.bridge.unbind(self.symbols[index], owner):
            return False
        sharing = [e for e in self.entries.values() if e.owners.get(index) == owner]
        for each in sharing:
            del each.graphs[index], each.owners[index]
        self.served[index] = {shapes: key for shapes, key in self.served[index].items() if key != owner}
        self.lost.add(index)
        keys = " and ".join(e.signature.key for e in sharing)
        detail = f"cluster {index}, {keys}: {finding.reason}; its other signatures keep their kernels"
        log.warning("stitchfleet: kernel unbound by the guard: %s", detail)
        self.ledger.event(SHAPE_EVENT, step, None, "unbound by the guard", detail=detail)
        return True

    def screen(self, findings: Sequence[tuple[int, Finding]], step: int) -> tuple[tuple[int, Finding], ...]:
        """The findings (controller position, finding) of the step under way left for the controller: a mismatch
        that `mismatch` dealt with by unbinding one signature's kernel is not a reason to revert the cluster.
        A kernel bound here that the step judged is judged (`fresh` no longer asks for it)."""
        entry = self.entries.get(self.signature.key) if self.signature is not None else None
        for k, _ in findings:
            if entry is not None and (self.order[k], entry.owners.get(self.order[k])) in self.unjudged:
                self.unjudged.discard((self.order[k], entry.owners[self.order[k]]))
                self.guesses = 0
        signature = self.signature
        return tuple((k, f) for k, f in findings if f.ok or not self.mismatch(self.order[k], signature, f, step))

    def fresh(self) -> list[int]:
        """The controller positions of the clusters whose kernel for the step under way's signature the guard has
        not judged yet: the step judges them whatever the periodic
        checks' turn (`Controller.step_plan`), so a kernel of a signature that periodic check steps never meet
        (a job alternating two batch sizes on even and odd steps, checks on even ones) is judged all the same.
        With a `tf.data` iterator the step's signature is known once it ran: the step then judges every cluster
        with a kernel not judged yet, against the kernel that ran (`graph`), for at most `signature_window`
        steps in a row that meet none of them (a signature the job stopped reading: periodic checks judge it)."""
        if self.signature is None and self.reading and self.unjudged:
            self.guesses += 1
            if self.guesses > self.current.signature_window:
                self.unjudged.clear()
                self.guesses = 0
            indices = {index for index, _ in self.unjudged}
            return [k for k, index in enumerate(self.order) if index in indices]
        entry = self.entries.get(self.signature.key) if self.signature is not None and self.unjudged else None
        if entry is None:
            return []
        return [k for k, index in enumerate(self.order) if (index, entry.owners.get(index, "")) in self.unjudged]

    # --- figures --------------------------------------------------------------------------------------

    def calls(self, key: str) -> dict[int, int]:
        """Per cluster index with a kernel for signature `key`, the calls of its dispatch op that ran that kernel
        (shared with the signatures it serves too: `Entry.owners`)."""
        entry = self.entries.get(key)
        owners = entry.owners if entry is not None else {}
        return {index: self.bridge.signature_calls(self.symbols[index], owner) for index, owner in owners.items()}

    def states(self) -> dict[str, str]:
        """Signature key -> what it has (SEEN, COMPILING, BOUND, LEFT, OVER)."""
        return {key: entry.state for key, entry in self.entries.items()}

    def bound(self) -> list[str]:
        """The signatures whose calls some cluster runs natively (begin's, unless a guess never fed)."""
        base = self.base.key if self.base is not None and self.guessed else None
        return [key for key, e in self.entries.items() if e.state == BOUND and e.graphs and key != base]

    # --- inside -------------------------------------------------------------------------------------

    def _entry(self, signature: Signature) -> Entry | None:
        if len(self.entries) >= TRACKED:
            return None
        entry = Entry(signature, deque(maxlen=self.current.signature_steps))
        self.entries[signature.key] = entry
        return entry

    def _start_next(self) -> None:
        if self.running is not None or not self.queue:
            return
        entry = self.queue.pop(0)
        thread = threading.Thread(target=self._compile, args=(entry.signature,), name="stitchfleet-signature")
        thread.daemon = True  # a compile past its time must not keep the process alive
        self.running = (entry, thread, time.monotonic())
        thread.start()

    def _compile(self, signature: Signature) -> None:
        """The background thread: builds the kernels; only `results` is written (under the lock)."""
        try:
            built = build(self.shapes, signature, self.clusters, current=self.current, fault=self.fault)
        except Exception as err:  # `build` says why per cluster; this is a last resort
            built = Built(left={c.index: f"{type(err).__name__}: {err}" for c, _ in self.clusters})
        with self.lock:
            self.results[signature.key] = built

    def _bind(self, entry: Entry, built: Built) -> None:
        for index, (executable, graph) in built.kernels.items():
            if not self.probes.allows(index, entry.signature.key):
                built.left[index] = f"{entry.signature.key}: its probe kept it at other signatures only"
                continue
            verdict = self.slower.get((*self.keys[index], input_shapes(graph)))
            if verdict is not None:  # the fleet found it slower at these shapes: TF's ops serve them
                built.left[index] = f"{entry.signature.key}: {verdict.reason}"
                continue
            owner = self.served.get(index, {}).get(inputs(executable))
            if owner is None:  # no kernel for these input shapes yet
                try:
                    self.bridge.bind(self.symbols[index], executable, entry.signature.key)
                except Exception as err:
                    built.left[index] = f"not bound for {entry.signature.key}: {type(err).__name__}: {err}"
                    continue
                owner = self.served.setdefault(index, {})[inputs(executable)] = entry.signature.key
                self.unjudged.add((index, owner))
                self.guesses = 0  # a new kernel gets its own tries
            entry.graphs[index], entry.owners[index] = graph, owner
        if built.left:
            self.ledger.rebuilt(built.left)
        entry.state = BOUND if entry.graphs else LEFT
        detail = f"{entry.signature.key}: {len(entry.graphs)} cluster(s) bound in {built.seconds:.1f} s"
        if entry.graphs:
            self.ledger.event(SHAPE_EVENT, None, None, "compiled", detail=f"{detail}, {len(built.left)} left")
        else:
            entry.reason = "; ".join(sorted(set(built.left.values())))[:500]
        log.info("stitchfleet: %s, %d left to TF's ops", detail, len(built.left))

    def _left(self, entry: Entry, why: str) -> None:
        entry.state, entry.reason = LEFT, why
        log.warning("stitchfleet: shape signature %s left to TF's ops: %s", entry.signature.key, why)
        self.ledger.event(SHAPE_EVENT, None, None, "left to TF", detail=f"{entry.signature.key}: {why}")
