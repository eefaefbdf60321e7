"""The rows a job records: typed, immutable, validated, and serialisable to one JSON object each.

Input: figures from the plugin (or any producer). Output: dataclasses the `Recorder` queues, the
store upserts on their natural keys, and the spool writes as JSON lines (`to_json`/`from_json`).
A row with impossible figures raises `ValueError` naming the field, at construction time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, ClassVar

from stitchfleet import settings as settings_module
from stitchfleet.telemetry import row_fields
from stitchfleet.telemetry.kinds import DeviceKind, EventKind, JobStatus, ProbeOutcome, Verdict, WindowMode


def utcnow() -> dt.datetime:
    """The current time, timezone-aware UTC (the only kind of time the store accepts)."""
    return dt.datetime.now(dt.UTC)


def new_job_uid() -> str:
    """A fresh run id, for a job started without STITCHFLEET_JOB_UID (rank 0 shares it)."""
    return uuid.uuid4().hex


def _require(condition: bool, row: object, message: str) -> None:
    if not condition:
        raise ValueError(f"{type(row).__name__}: {message}")


def _require_choice(row: object, name: str, value: str, choices: type[Any]) -> None:
    allowed = [member.value for member in choices]
    _require(value in allowed, row, f"{name}={value!r}: expected one of {', '.join(allowed)}")


def _require_aware(row: object, name: str, value: dt.datetime | None) -> None:
    _require(value is None or value.tzinfo is not None, row, f"{name}={value!r}: needs a timezone (use UTC)")


def _require_finite(row: object, name: str, value: float | None, *, minimum: float | None = None) -> None:
    if value is None:
        return
    _require(math.isfinite(value), row, f"{name}={value!r}: expected a finite number")
    _require(minimum is None or value >= minimum, row, f"{name}={value!r}: expected a value >= {minimum}")


@dataclass(frozen=True)
class JobKey:
    """A job's natural key: one run of a named job in a namespace of a cluster."""

    cluster: str
    namespace: str
    job_name: str
    job_uid: str

    def __post_init__(self) -> None:
        for name in ("cluster", "namespace", "job_name", "job_uid"):
            _require(bool(getattr(self, name)), self, f"{name} is empty")

    @classmethod
    def from_settings(cls, current: settings_module.Settings, job_uid: str = "") -> JobKey:
        """The key from STITCHFLEET_CLUSTER/NAMESPACE/JOB_NAME/JOB_UID; `job_uid` fills a missing uid."""
        uid = current.job_uid or job_uid
        _require(bool(uid), cls, "no job uid: set STITCHFLEET_JOB_UID or pass one (new_job_uid() on rank 0)")
        return cls(current.cluster, current.namespace, current.job_name or script_job_name(), uid)


def script_job_name(argv0: str | None = None) -> str:
    """The job name an empty STITCHFLEET_JOB_NAME stands for (as the settings document): the script's name
    without its extension (`python train_mnist.py` -> "train_mnist"), "python" for `-c` or an interactive
    interpreter. Every job used to be booked as "job", so the report could not tell jobs apart."""
    text = sys.argv[0] if argv0 is None and sys.argv else (argv0 or "")
    stem = PurePath(text.rstrip("/")).stem if text.strip("/") else ""
    if stem in ("", "-c", "-m", "-"):
        return "python"
    return stem[:253]


@dataclass(frozen=True)
class JobStarted:
    """A rank started: the job's identity and resources."""

    job: JobKey
    rank: int = 0
    team: str = ""
    model: str = ""
    pod_name: str = ""
    world_size: int = 1
    gpus_per_rank: int = 1
    gpu_type: str = ""
    started_at: dt.datetime = field(default_factory=utcnow)
    # Measured by the rank itself ("" and None: not measured, e.g. the operator's view of a pod);
    # gpus_per_rank above is what was declared (the container's GPU limit).
    device_kind: str = ""
    devices_per_rank: int | None = None

    def __post_init__(self) -> None:
        _require(self.rank >= 0, self, f"rank={self.rank}: expected >= 0")
        _require(self.world_size >= 1, self, f"world_size={self.world_size}: expected >= 1")
        _require(self.rank < self.world_size, self, f"rank={self.rank} is not below world_size={self.world_size}")
        _require(self.gpus_per_rank >= 0, self, f"gpus_per_rank={self.gpus_per_rank}: expected >= 0")
        if self.device_kind:
            _require_choice(self, "device_kind", self.device_kind, DeviceKind)
        _require(
            self.devices_per_rank is None or self.devices_per_rank >= 1,
            self,
            f"devices_per_rank={self.devices_per_rank}: expected >= 1 (None when not measured)",
        )
        _require_aware(self, "started_at", self.started_at)


@dataclass(frozen=True)
class JobCompiled:
    """A rank finished compiling; the job keeps the slowest rank's seconds as its overhead."""

    job: JobKey
    rank: int
    compile_seconds: float

    def __post_init__(self) -> None:
        _require_finite(self, "compile_seconds", self.compile_seconds, minimum=0.0)


@dataclass(frozen=True)
class JobOverhead:
    """A rank's plugin cost beyond what the user's graph costs, so far (measured, cumulative): its own work on the
    steps no window's saving pays (plugin.control.plugin_cost). The job keeps the slowest rank's, like its compile."""

    job: JobKey
    rank: int
    overhead_seconds: float

    def __post_init__(self) -> None:
        _require_finite(self, "overhead_seconds", self.overhead_seconds, minimum=0.0)


@dataclass(frozen=True)
class JobFinished:
    """A rank ended; the worst status over all ranks wins (failed > reverted > finished)."""

    job: JobKey
    status: str
    reason: str = ""
    rank: int = 0
    ended_at: dt.datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_choice(self, "status", self.status, JobStatus)
        _require_aware(self, "ended_at", self.ended_at)


@dataclass(frozen=True)
class StepWindow:
    """One rank's figures over consecutive steps; keyed by (job, rank, window_index)."""

    job: JobKey
    rank: int
    window_index: int
    first_step: int
    last_step: int
    iterations: int
    mode: str
    step_seconds_sum: float
    baseline_step_seconds: float | None = None
    saved_seconds: float = 0.0
    recorded_at: dt.datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require(self.rank >= 0 and self.window_index >= 0, self, "rank and window_index must be >= 0")
        _require(self.last_step >= self.first_step, self, f"last_step={self.last_step} < first_step={self.first_step}")
        _require(self.iterations >= 1, self, f"iterations={self.iterations}: expected >= 1")
        _require_choice(self, "mode", self.mode, WindowMode)
        _require_finite(self, "step_seconds_sum", self.step_seconds_sum, minimum=0.0)
        _require_finite(self, "baseline_step_seconds", self.baseline_step_seconds, minimum=0.0)
        _require_finite(self, "saved_seconds", self.saved_seconds)
        _require_aware(self, "recorded_at", self.recorded_at)


@dataclass(frozen=True)
class Event:
    """Something that happened once (revert, compile failure, guard check); keyed by `uuid`."""

    job: JobKey
    kind: str
    rank: int = 0
    step: int | None = None
    cluster_fingerprint: str | None = None
    reason: str = ""
    detail: str = ""
    passed: bool | None = None
    max_abs_error: float | None = None
    error_ratio: float | None = None
    occurred_at: dt.datetime = field(default_factory=utcnow)
    uuid: str = field(default_factory=lambda: str(uuid.uuid4()))

    MAX_REASON: ClassVar[int] = 64

    def __post_init__(self) -> None:
        _require_choice(self, "kind", self.kind, EventKind)
        _require(len(self.reason) <= self.MAX_REASON, self, f"reason longer than {self.MAX_REASON} characters")
        _require_finite(self, "max_abs_error", self.max_abs_error, minimum=0.0)
        _require_finite(self, "error_ratio", self.error_ratio, minimum=0.0)
        _require_aware(self, "occurred_at", self.occurred_at)


@dataclass(frozen=True)
class ClusterVerdict:
    """A cluster fingerprint's standing for the fleet; `reverted` is sticky."""

    fingerprint: str
    verdict: str
    reason: str = ""
    op_count: int | None = None
    updated_at: dt.datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require(bool(self.fingerprint), self, "fingerprint is empty")
        _require_choice(self, "verdict", self.verdict, Verdict)
        _require_aware(self, "updated_at", self.updated_at)


@dataclass(frozen=True)
class JobVerdict:
    """One job's verdict for a cluster fingerprint: what the operator stores of a pod's ClusterVerdict,
    keyed by the job it knows the pod by (evidence for the fleet, never the fleet's word by itself)."""

    job: JobKey
    fingerprint: str
    verdict: str
    reason: str = ""
    op_count: int | None = None
    recorded_at: dt.datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require(bool(self.fingerprint), self, "fingerprint is empty")
        _require_choice(self, "verdict", self.verdict, Verdict)
        _require(self.verdict != Verdict.CLEARED, self, "verdict=cleared: only an admin or a recheck clears")
        _require_aware(self, "recorded_at", self.recorded_at)

    @classmethod
    def of(cls, verdict: ClusterVerdict, job: JobKey) -> JobVerdict:
        """`verdict` as the evidence of `job`."""
        return cls(job, verdict.fingerprint, verdict.verdict, verdict.reason, verdict.op_count, verdict.updated_at)


@dataclass(frozen=True)
class ProbeVerdict:
    """One job's probe finding for a cluster on a device profile at given input shapes; keyed by (job,
    fingerprint, profile, shapes). A job's, so the operator checks the job owns it: the fleet counts
    distinct jobs, and a pod must not be able to speak for others."""

    job: JobKey
    fingerprint: str
    profile: str
    shapes: str
    outcome: str
    detail: str = ""
    recorded_at: dt.datetime = field(default_factory=utcnow)

    MAX_PROFILE: ClassVar[int] = 128
    MAX_SHAPES: ClassVar[int] = 256

    def __post_init__(self) -> None:
        _require(bool(self.fingerprint), self, "fingerprint is empty")
        _require(len(self.profile) <= self.MAX_PROFILE, self, f"profile longer than {self.MAX_PROFILE} characters")
        _require(len(self.shapes) <= self.MAX_SHAPES, self, f"shapes longer than {self.MAX_SHAPES} characters")
        _require_choice(self, "outcome", self.outcome, ProbeOutcome)
        _require_aware(self, "recorded_at", self.recorded_at)


Row = (
    JobStarted
    | JobCompiled
    | JobOverhead
    | JobFinished
    | StepWindow
    | Event
    | ClusterVerdict
    | JobVerdict
    | ProbeVerdict
)
ROW_TYPES: dict[str, type[Row]] = {
    cls.__name__: cls
    for cls in (
        JobStarted,
        JobCompiled,
        JobOverhead,
        JobFinished,
        StepWindow,
        Event,
        ClusterVerdict,
        JobVerdict,
        ProbeVerdict,
    )
}
_TIME_FIELDS = frozenset({"started_at", "ended_at", "recorded_at", "occurred_at", "updated_at"})


def _plain(name: str, value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, JobKey):
        return dataclasses.asdict(value)
    return str(value) if name in ("status", "mode", "kind", "verdict", "outcome") else value


def to_json(row: Row) -> dict[str, Any]:
    """A JSON-ready dict of the row, tagged with its type."""
    data = {f.name: _plain(f.name, getattr(row, f.name)) for f in dataclasses.fields(row)}
    return {"type": type(row).__name__, **data}


def from_json(data: dict[str, Any]) -> Row:
    """The row back from `to_json`'s dict; ValueError naming the problem when it is not one
    (row_fields: strict types, column ranges and lengths, no NUL)."""
    values = dict(data)
    kind = values.pop("type", None)
    cls = ROW_TYPES.get(str(kind)) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown row type {str(kind)[:64]!r}")
    row_fields.check(cls, values)
    if "job" in values:
        try:
            values["job"] = JobKey(**values["job"])
        except TypeError as err:
            raise ValueError(f"{kind}.job: {err}") from None
    for name in _TIME_FIELDS & values.keys():
        try:
            values[name] = dt.datetime.fromisoformat(values[name])
        except ValueError:
            raise ValueError(f"{kind}.{name}: {values[name]!r} is not an ISO 8601 time") from None
    try:
        return cls(**values)
    except TypeError as err:
        raise ValueError(f"{kind}: {err}") from None
