"""What a planned training step adds to the user's run: the feeds and fetches of the controller's `StepPlan`.

Input: the plan of the step (`Controller.step_plan`), the rewired graph's switch vector and check placeholder,
the installed clusters' check tensors, the loss (the user's and the twin's), the consensus and the shape kernels.
Output: the step's `SessionRunArgs` (the switches on the twin, the loss, the shapes read, the checks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from stitchfleet.plugin.control.step_contract import StepPlan
from stitchfleet.plugin.graph.rewrite import Installed
from stitchfleet.plugin.graph.training_steps import TrainingSteps
from stitchfleet.plugin.horovod.decision_sums import Consensus

if TYPE_CHECKING:
    from stitchfleet.plugin.shapes.signature_kernels import SignatureKernels


class StepArgs:
    """Maps a step's plan onto its feeds and fetches (see the module docstring)."""

    def __init__(
        self,
        consensus: Consensus,
        training: TrainingSteps,
        *,
        switches: tf.Tensor,
        positions: list[int],
        count: int,
        checking: tf.Tensor,
        installed: list[Installed],
        loss: tf.Tensor | None,
        twin_loss: tf.Tensor | None,
        signatures: SignatureKernels | None,
    ) -> None:
        self.consensus, self.training, self.signatures = consensus, training, signatures
        self.switches, self.positions, self.count, self.checking = switches, positions, count, checking
        self.loss, self.twin_loss = loss, twin_loss
        self.every = positions == list(range(count))  # the controller's positions are the switch vector's own
        self.loss_name = loss.op.name if loss is not None else None  # read once: a TF call each step otherwise
        # Every cluster's tensors, although only those switched on are judged: one set of fetches for all
        # check steps. A set per probed cluster cost a new TF executor each (graph pruning and grappler,
        # ~300 ms on the demo model) the first time it ran.
        self.checks = [(done.inputs, done.original, done.switched) for done in installed]

    def planned(self, plan: StepPlan) -> tf.compat.v1.train.SessionRunArgs | None:
        """The feeds and fetches of a step that is not quiet: the consensus always, and what the plan runs. None
        when it adds nothing: a single rank's baseline step runs as plain TF's does (docs/plugin/session.md)."""
        feeds, fetches = self.consensus.args(plan.local)
        # Every switch off: the user's own graph runs, exactly plain TF. Otherwise the twin runs (the plan
        # says which, the same on every rank, so Horovod ranks name the same collectives at every step).
        if plan.on_twin:
            if self.every:  # every installed cluster runs under the controller (most jobs): no scatter per step
                switches = plan.switches.copy()  # the feed is its own array, as before: the plan's stays read-only
            else:
                switches = np.zeros(self.count, dtype=bool)
                switches[self.positions] = plan.switches
            feeds[self.switches] = switches
        # the twin's loss, watched for NaN/Inf; only a loss the step computes anyway (no feed it lacks)
        if plan.on_twin and self.twin_loss is not None and self.reaches_loss:
            fetches["loss"] = self.twin_loss
        if self.signatures is not None and self.signatures.reading:
            fetches["shapes"] = self.signatures.shapes.fetches  # the shapes the step's iterator reads have
        if plan.checks:
            fetches["checks"] = self.checks
            feeds[self.checking] = True
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feeds) if fetches or feeds else None

    @property
    def reaches_loss(self) -> bool:
        """Whether this thread's run computes the loss anyway (then it is fetched: never an op the run would skip,
        so the user's random streams draw as written)."""
        return self.loss_name in self.training.reached

    def consensus_only(self, plan: StepPlan) -> tf.compat.v1.train.SessionRunArgs | None:
        """A step whose preparation failed: only its part of the consensus (no rank may wait)."""
        feeds, fetches = self.consensus.args(plan.local)
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feeds) if fetches else None
