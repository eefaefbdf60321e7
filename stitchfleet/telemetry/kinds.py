"""The telemetry vocabulary: job statuses, window modes, event kinds, verdicts and their ranks.

Input: none. Output: string enums (probe outcomes too) shared by the rows (`rows`, importable in a pod with only the
standard library) and the SQLAlchemy tables (`models`). No SQLAlchemy here, on purpose: a
training pod without it must still build and spool rows.
"""

from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    """Lifecycle of a job; a later status never goes back to an earlier one (see STATUS_RANK)."""

    RUNNING = "running"
    FINISHED = "finished"
    REVERTED = "reverted"
    FAILED = "failed"


# Ranks report independently; the worst outcome wins whatever the arrival order.
STATUS_RANK = {JobStatus.RUNNING: 0, JobStatus.FINISHED: 1, JobStatus.REVERTED: 2, JobStatus.FAILED: 3}


class DeviceKind(enum.StrEnum):
    """What a job's ranks compute on; its saved hours are in that device's unit, never mixed."""

    GPU = "gpu"
    CPU = "cpu"


class WindowMode(enum.StrEnum):
    """What ran during a step window."""

    WARMUP = "warmup"
    BASELINE = "baseline"
    STITCHED = "stitched"
    REVERTED = "reverted"


class EventKind(enum.StrEnum):
    """Kinds of events a job reports."""

    REVERT = "revert"
    COMPILE_FAILURE = "compile_failure"
    GUARD_CHECK = "guard_check"
    CLUSTER_ENABLED = "cluster_enabled"
    PROBE = "probe"  # a probed cluster left to TF (slower than its TF ops), or no cluster kept: not a revert
    FLEET_MEMORY = "fleet_memory"  # the job began without the operator's quarantine (or from its cache)
    SHAPE_SIGNATURE = "shape_signature"  # `None` dimensions: the sizes its clusters were built for, and misses
    SETUP = "setup"  # what the hook's begin cost: its seconds, the cluster compiles and the compile budget
    ROWS_REFUSED = "rows_refused"  # the operator refused a row for good: the pod kept it in its dead-letter file
    QUARANTINE_CLEARED = "quarantine_cleared"  # an admin (or a recheck) cleared a fleet entry; detail: who and why
    QUARANTINE_CONFIRMED = "quarantine_confirmed"  # an admin made a job's revert fleet-wide; detail: who and why
    NOT_ATTACHED = "not_attached"  # the job's training steps run without the hook (a session it cannot join); why


# A `setup` event's reason when the run was a holdout: one run in every STITCHFLEET_HOLDOUT_EVERY that would set up
# runs as written and timed instead, so that the report can set the job's stitched runs against plain TF measured
# in processes of its own (telemetry/holdout.py), not only against the in-job baseline blocks.
HOLDOUT_REASON = "setup skipped: holdout"


class Verdict(enum.StrEnum):
    """A cluster fingerprint's standing; reverted is sticky (see VERDICT_RANK) until cleared."""

    ENABLED = "enabled"
    DISABLED = "disabled"
    REVERTED = "reverted"
    # Set by an admin (`stitchfleet fleet quarantine clear`) or a recheck, never by a pod: it undoes a
    # fleet entry, and ranks lowest so that later evidence can quarantine the fingerprint again.
    CLEARED = "cleared"


VERDICT_RANK = {Verdict.CLEARED: -1, Verdict.ENABLED: 0, Verdict.DISABLED: 1, Verdict.REVERTED: 2}


class ProbeOutcome(enum.StrEnum):
    """What one job's probe found for a (fingerprint, device profile, shapes): its evidence for the fleet."""

    SLOWER = "slower"
    FASTER = "faster"
