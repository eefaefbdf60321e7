"""The setup of a job whose setup can pay back: its clusters chosen, compiled, checked and installed on a twin.

Input: the user's graph at `begin` (found to train and to repay its setup), the settings, backend and ledger.
Output: a `Setup` (clusters installed, switches, the twin's diverter), then, once every rank agreed, its step path.
The hook imports it only then: a skipped setup imports no compiler pipeline or graph rewrite (docs/plugin/session.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.schedule import Timing
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.graph.mapping import Site, StepOps
from stitchfleet.plugin.graph.rewrite import Installed, rewire
from stitchfleet.plugin.graph.training_steps import TrainingSteps, find_loss
from stitchfleet.plugin.graph.twin import Diverter
from stitchfleet.plugin.graph.twin import build as build_twin
from stitchfleet.plugin.guard.translation import check_sites
from stitchfleet.plugin.horovod.decision_sums import Consensus
from stitchfleet.plugin.native.dispatch_op import BridgeOp
from stitchfleet.plugin.native.dispatch_op import choose as choose_bridge
from stitchfleet.plugin.session.step_args import StepArgs
from stitchfleet.plugin.session.step_path import StepPath
from stitchfleet.plugin.session.step_results import StepResults
from stitchfleet.plugin.setup import job_graph, selection
from stitchfleet.plugin.shapes.signature_kernels import Job, SignatureKernels
from stitchfleet.plugin.shapes.signatures import Specialisation

if TYPE_CHECKING:
    from stitchfleet.plugin.fleet.fleet_memory import Recollection
    from stitchfleet.plugin.native.faults import Fault

Recalled = tuple["Recollection", float]  # the fleet's memory the hook read before importing this module; when it began
Off = Callable[[int, str, str, str], None]  # a cluster left off: (index, fingerprint, reason, event kind)
log = logging.getLogger("stitchfleet.plugin")  # the hook's (one logger per name: its rank filter applies here)


@dataclass
class Setup:
    """What `JobSetup.run` installed: the clusters and, per cluster index, its site in the user's graph."""

    installed: list[tuple[Cluster, Installed]]
    originals: dict[int, Site]
    switches: tf.Tensor  # the graph's switch vector, fed per step (one bool per cluster installed at begin)
    checking: tf.Tensor  # fed True on check steps: ref inputs are copied (`check_reads`)
    bridge: BridgeOp | None
    faults_seen: int  # the bridge's fault count at setup (its later faults are the job's)
    shapes: Specialisation
    loss_tensor: tf.Tensor | None  # the loss in the user's graph
    twin_loss: tf.Tensor | None  # and its value on the twin
    diverter: Diverter | None  # runs a step on the stitched twin (see twin.py)
    built: str  # the compiles, described for the log and the `setup` event
    recorded: str = ""  # its record in the kernel cache (`setup_record`), which the job's end adds its figures to
    backend: str = ""  # the backend the record's kernels were built for
    warm: bool = False  # every kernel came from the kernel cache: its seconds are what a warm run pays again
    cold_seconds: float = 0.0  # its compiles' wall, translation checks and op build: what the cache spares a warm run

    def started(
        self,
        installed: list[tuple[Cluster, Installed]],
        positions: list[int],
        *,
        current: settings_module.Settings,
        consensus: Consensus,
        ledger: Ledger,
        training: TrainingSteps,
        spent: float,
        job_steps: int | None,
        fault: tuple[Fault, int] | None,
    ) -> StepPath:
        """The controller over `installed` (the clusters at `positions`, on which all ranks agreed), and the
        step path that runs it; `spent`: the setup's seconds so far."""
        signatures = None
        if installed and self.bridge is not None and self.shapes.signature is not None:
            job = Job(self.bridge, current, ledger, fault)
            signatures = SignatureKernels(self.shapes, installed, self.originals, job)
        controller = Controller(
            [c for c, _ in installed],
            Timing.from_settings(current),
            ledger,
            consensus.size,
            spent,
            kernels=signatures.probes if signatures else None,
            job_steps=job_steps,
        )
        consensus.clusters = len(installed)
        training.require([self.originals[done.site.index].internal for _, done in installed])
        step_args = StepArgs(
            consensus,
            training,
            switches=self.switches,
            positions=positions,
            count=len(self.installed),
            checking=self.checking,
            installed=[done for _, done in installed],
            loss=self.loss_tensor,
            twin_loss=self.twin_loss,
            signatures=signatures,
        )
        step_results = StepResults(
            current, consensus, installed, signatures, bridge=self.bridge, faults_seen=self.faults_seen
        )
        return StepPath(controller, step_args, step_results, signatures, self.diverter)


class JobSetup:
    """One `begin`'s setup, from the fleet's memory of the job's graph to the twin and its rewired switches."""

    def __init__(
        self, graph: tf.Graph, current: settings_module.Settings, backend: str, ledger: Ledger, recalled: Recalled
    ) -> None:
        self.graph, self.current, self.backend, self.ledger = graph, current, backend, ledger
        self.memory, self.began = recalled  # the setup's seconds count from the hook's read of the fleet's memory
        self.steps: StepOps | None = None

    def specialise(self) -> Specialisation:
        """The shape signature the job's clusters are compiled for (kept by the hook even if setup fails later:
        it learns the signatures fed for the job's next processes)."""
        self.steps = StepOps(self.graph)
        return Specialisation(self.graph, self.steps, self.current.cache_dir, self.ledger)

    def run(
        self,
        shapes: Specialisation,
        off: Off,
        *,
        loss: tf.Tensor | None,
        fault: Fault | None,
        rank: int,
        agreeing: bool,
        owner: object,
    ) -> Setup:
        """Chooses, compiles and checks the clusters, builds the twin and rewires it; each cluster left off goes
        to `off` as soon as it is (a later failure of the setup keeps them recorded). `owner`: the hook, whose
        step fetches the diverter leaves off a rerun as written."""
        current, graph, steps = self.current, self.graph, self.steps
        assert steps is not None, "specialise() first"
        conversion, art = job_graph.compiled(steps, shapes, current)
        found = selection.choose(
            graph,
            conversion,
            art,
            backend=self.backend,
            known_bad=set(self.memory.reverted),
            current=current,
            fault=fault,
            rank=rank,
            agreeing=agreeing,
            slower=self.memory.slower,
            signature=shapes,
        )
        checked = time.perf_counter()
        if current.translation_check and found.sites:
            found.refuse(check_sites(graph, found.sites, current.tolerance_factor, current.cache_dir))
        cold = time.perf_counter() - checked + (found.compiles.seconds if found.compiles.compiled else 0.0)
        for kind, left in (("compile_failure", found.left), ("probe", found.slower)):  # slower: a probe saved
            for index, fingerprint, reason in left:
                off(index, fingerprint, reason, kind)
        sites, clusters = found.sites, found.clusters
        chosen = time.perf_counter()
        bridge = choose_bridge(current.bridge, self.backend, current.cache_dir)
        if found.building_op:  # the wait for the op's build this setup started: the cache spares the next run it
            cold += time.perf_counter() - chosen
        twin = build_twin(graph, found.mapped) if sites else None
        twin_sites = [twin.site(site) for site in sites] if twin is not None else []
        rewired = rewire(graph, twin_sites, [c.kernel for c in clusters], bridge)
        installed: list[tuple[Cluster, Installed]] = []
        for cluster, done in zip(clusters, rewired.clusters, strict=True):
            if isinstance(done, str):
                log.warning("stitchfleet: cluster %d left to TF: %s", cluster.index, done)  # a failure
                off(cluster.index, cluster.fingerprint, done, "compile_failure")
            else:
                installed.append((cluster, done))
        loss_tensor = find_loss(graph, loss)
        diverter, twin_loss = None, None
        if twin is not None:
            diverter = Diverter(twin, owner=owner, shared=("consensus",))
            twin_loss = rewired.current(twin.tensor(loss_tensor)) if loss_tensor is not None else None
        return Setup(
            installed=installed,
            originals={site.index: site for site in sites},
            switches=rewired.switches,
            checking=rewired.checking,
            bridge=bridge,
            faults_seen=bridge.faults() if bridge is not None else 0,
            shapes=shapes,
            loss_tensor=loss_tensor,
            twin_loss=twin_loss,
            diverter=diverter,
            built=found.compiles.describe(current.compile_budget),
            recorded=found.recorded,
            backend=self.backend,
            warm=found.compiles.built > 0 and found.compiles.compiled == 0,
            cold_seconds=cold,
        )

    def seconds(self) -> float:
        """The setup's seconds so far."""
        return time.perf_counter() - self.began
