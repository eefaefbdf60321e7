"""Every STITCHFLEET_* knob, declared once: name, type, default, meaning.

Input: an environment mapping (os.environ by default). Output: a frozen `Settings`
object. This is the only module of stitchfleet that reads the environment; every
other module asks `current()` or receives a `Settings`. A malformed value raises
`SettingsError` naming the variable, the value and the type that was expected.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitchfleet import __version__

PREFIX = "STITCHFLEET_"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})

# The backends are the compiler's target folders (compiler/targets/<name>/, `_` read as `-`), listed
# from disk, not imported: settings loads in telemetry and operator processes, which must not import
# the compiler (import-linter). The target registry (compiler/targets/__init__.py) reads TARGETS.
TARGETS_DIR = Path(__file__).parent / "compiler" / "targets"


def _target_names() -> tuple[str, ...]:
    folders = (p for p in TARGETS_DIR.iterdir() if (p / "__init__.py").is_file())
    return tuple(sorted(p.name.replace("_", "-") for p in folders))


TARGETS = _target_names()
BACKENDS = ("auto", *TARGETS)
BRIDGES = ("auto", "native", "python")
DEVICES = ("h200", "v100")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class SettingsError(ValueError):
    """A STITCHFLEET_* variable holds a value that cannot be used."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("expected a boolean (1/0, true/false, yes/no, on/off)")


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def _parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError("expected a number") from None


def _parse_path(text: str) -> Path:
    return Path(text).expanduser()


# Keyed by the annotation's text: the module uses postponed annotations.
_PARSERS: dict[str, Callable[[str], Any]] = {
    "bool": _parse_bool,
    "int": _parse_int,
    "float": _parse_float,
    "str": str,
    "Path": _parse_path,
}


def _knob(default: Any, doc: str, *, choices: tuple[str, ...] = (), minimum: float | None = None) -> Any:
    """Declares one setting; the metadata drives parsing, validation and `describe()`."""
    return field(default=default, metadata={"doc": doc, "choices": choices, "minimum": minimum})


def _default_state_dir() -> Path:
    # XDG state dir when set by the platform, else the user's home: a job needs no setup to record.
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "stitchfleet"


@dataclass(frozen=True)
class Settings:
    """The typed view of all STITCHFLEET_* variables. Field `foo_bar` is STITCHFLEET_FOO_BAR."""

    # plugin: turning it on, which backend, how it is guarded
    enabled: bool = _knob(False, "Attach the stitching hook to every MonitoredSession of the job.")
    backend: str = _knob("auto", "Kernel backend: auto picks cuda on a GPU, else cpu.", choices=BACKENDS)
    bridge: str = _knob(
        "auto", "How the step calls cpu clusters: native TF op, python (numpy_function), auto.", choices=BRIDGES
    )
    device: str = _knob("h200", "Device profile the planner targets (occupancy model).", choices=DEVICES)
    warmup_steps: int = _knob(10, "Steps run untouched before timing starts.", minimum=0)
    baseline_steps: int = _knob(20, "Steps per baseline window (all clusters off).", minimum=1)
    rebaseline_every: int = _knob(
        200,
        "Steps between the starts of two baseline blocks of the stitched phase: each stitched window is compared with"
        " the blocks on either side of it (paired), so a load spike hits both.",
        minimum=1,
    )
    paired_steps: int = _knob(
        10,
        "Steps of each baseline block of the stitched phase (the user's graph; at most BASELINE_STEPS): with"
        " REBASELINE_EVERY 200, 5% of the stitched phase's steps forgo the stitched saving to measure it; the"
        " first SETTLE_STEPS (5) after stitched ones pay the switch and are no part of the reference.",
        minimum=1,
    )
    settle_steps: int = _knob(
        300,
        "Steps of the job's first baseline block, the settle block (at most PROBE_SHARE of a job of known length; none"
        " when the length is unknown): plain TF's steps after 0.3 s of it, settled, are what the stitched windows'"
        " savings are measured against at most (a short block of plain TF between stitched steps runs slower than a"
        " plain process: docs/plugin/control.md).",
        minimum=0,
    )
    window_steps: int = _knob(100, "Steps per telemetry window.", minimum=1)
    check_every: int = _knob(100, "Steps between numeric checks against the fp64 reference.", minimum=1)
    check_first: int = _knob(5, "Checks a cluster passes when it first runs stitched (probe checks count).", minimum=0)
    check_budget: float = _knob(
        0.01, "Skip periodic checks while checks took more than this share of the job's time.", minimum=0.0
    )
    check_max_gap: int = _knob(
        1000, "Steps at most between two periodic checks, whatever the check budget (never starved).", minimum=1
    )
    check_clusters: int = _knob(
        1, "Clusters judged per periodic check step, in rotation (0: every cluster switched on).", minimum=0
    )
    tolerance_factor: float = _knob(
        8.0, "A stitched result may be this many times further from fp64 than unfused fp32.", minimum=1.0
    )
    compile_budget: float = _knob(
        120.0,
        "Seconds of cluster compiles a job may spend in begin; clusters past it stay with TF (and are compiled"
        " into the kernel cache in the background, for a later pod sharing that cache).",
        minimum=0.0,
    )
    compile_workers: int = _knob(
        0, "Cluster compiles (C compiler processes) run at once in begin (0: one per core, at most 4).", minimum=0
    )
    translation_check: bool = _knob(
        True, "Before install, check each cluster's IR against TF's own ops on random inputs (refuse on mismatch)."
    )
    signatures_max: int = _knob(
        4,
        "Shape signatures (e.g. batch sizes where the graph says None) a job compiles its clusters for; past it, new"
        " signatures run TF's ops, counted.",
        minimum=1,
    )
    signature_steps: int = _knob(
        3,
        "A new shape signature is compiled once seen on this many training steps within SIGNATURE_WINDOW steps (an"
        " epoch's last partial batch never is).",
        minimum=1,
    )
    signature_window: int = _knob(100, "Training steps within which SIGNATURE_STEPS sightings must fall.", minimum=1)
    signature_compile_seconds: float = _knob(
        600.0,
        "Longest the background compile of one signature may take; past it, that signature is left to TF's ops.",
        minimum=1.0,
    )
    slowdown_margin: float = _knob(
        0.05, "Revert when stitched steps are slower than baseline by this share.", minimum=0.0
    )
    probe_steps: int = _knob(
        10, "Steps per probe window: each half of a probe pair (0: keep all, no probes).", minimum=0
    )
    probe_margin: float = _knob(0.01, "Keep a cluster only when it beats its baseline by this share.", minimum=0.0)
    probe_rounds: int = _knob(2, "Rounds of probe pairs (order alternates per round; medians pooled).", minimum=1)
    probe_group: bool = _knob(
        True, "Probe every cluster on together first; once proven, a cluster is dropped only when slower."
    )
    probe_group_factor: int = _knob(
        4, "The group probe runs this many times PROBE_ROUNDS rounds (its decision gates all).", minimum=1
    )
    probe_reruns: int = _knob(
        2,
        "Run a probe pair again when some rank had no figures for it (its kernels compiling), at most this often.",
        minimum=0,
    )
    probe_min_steps: int = _knob(
        3,
        "Timed steps each half of a probe pair needs at the signature it is decided on; with fewer its rank has no"
        " figures for the pair (it runs again, or decides nothing): one step decides on noise.",
        minimum=1,
    )
    probe_share: float = _knob(
        0.05,
        "Most of the job's remaining steps that exploring a losing configuration may take: per-cluster probes after"
        " the group lost run only when they fit, and setup only when its warmup and group probe fit.",
        minimum=0.0,
    )
    job_steps: int = _knob(
        0,
        "The job's training steps, when known (0: read from the job's StopAtStepHook, or unknown).",
        minimum=0,
    )
    step_ms: float = _knob(
        0.0,
        "The job's plain step time in ms, when known (the fleet's memory of earlier runs, or the user): with the"
        " job's length it decides whether setup can pay back at all (0: unknown, setup runs).",
        minimum=0.0,
    )
    setup_share: float = _knob(
        0.1,
        "A plain tf.compat.v1.Session job of unknown length (one rank) sets up once its setup's fixed cost is at most"
        " this share of the time it has trained: until then its steps run as written (0: set up at its first"
        " training step).",
        minimum=0.0,
    )
    holdout_every: int = _knob(
        10,
        "One run in this many of a single-rank job whose setup record on the node says its setup pays runs as written"
        " and timed instead (a holdout): plain TF's step in a process of its own, which the report sets the job's"
        " stitched runs against (0: never).",
        minimum=0,
    )
    remote_stitch_budget: int = _knob(8, "Most independent clusters merged into one stitch op.", minimum=1)
    dump_dir: str = _knob("", "Write every compiler artifact here, and why the plugin changed a cluster (empty: off).")
    # Home-relative defaults are resolved once, at import: a process's home does not move.
    cache_dir: Path = _knob(Path.home() / ".cache" / "stitchfleet", "Compiled kernel cache.")  # noqa: RUF009
    # telemetry
    db_url: str = _knob("", "SQLAlchemy URL of the telemetry database (empty: SQLite in state_dir).")
    state_dir: Path = _knob(_default_state_dir(), "Local state: default SQLite file and the spool.")  # noqa: RUF009
    metrics_port: int = _knob(0, "Serve Prometheus metrics on this port (0: off).", minimum=0)
    flush_seconds: float = _knob(5.0, "Longest a clean shutdown waits for telemetry to flush.", minimum=0.0)
    # telemetry from a pod: shipped to the operator's ingestion endpoint (the webhook injects these)
    ingest_url: str = _knob("", "HTTPS URL of the operator's ingestion endpoint (empty: local mode, no operator).")
    ingest_ca: str = _knob("", "PEM of the CA that signs the ingestion endpoint's certificate (empty: system CAs).")
    ingest_ca_file: str = _knob(
        "",
        "Mounted file holding that CA, which rotation updates: preferred to STITCHFLEET_INGEST_CA while it holds a"
        " certificate, re-read when the endpoint's certificate fails to verify (empty: the variable only).",
    )
    ingest_server_name: str = _knob("", "Name the endpoint's certificate must carry (empty: the URL's host).")
    ingest_token_file: Path = _knob(  # noqa: RUF009
        Path("/var/run/secrets/stitchfleet.io/token/token"),
        "The pod's projected ServiceAccount token (re-read per request).",
    )
    ingest_audience: str = _knob(
        "stitchfleet", "Audience the pods' ingestion tokens are bound to (operator checks it)."
    )
    ingest_token_seconds: int = _knob(3600, "Lifetime of the projected token the webhook gives pods.", minimum=600)
    ingest_timeout_seconds: float = _knob(10.0, "Longest one request to the ingestion endpoint may take.", minimum=0.1)
    ingest_max_backoff_seconds: float = _knob(
        60.0, "Longest wait between two shipping attempts while the endpoint is unreachable.", minimum=0.1
    )
    ingest_batch_rows: int = _knob(500, "Rows per request to the ingestion endpoint.", minimum=1)
    fleet_memory_timeout_seconds: float = _knob(
        3.0, "Longest `begin` waits for the fleet's quarantined clusters from the operator.", minimum=0.1
    )
    # the fleet's memory of slower clusters (operator and local database alike)
    slower_jobs: int = _knob(
        2, "Distinct jobs that must find a cluster slower (same device profile and shapes) to start it off.", minimum=2
    )
    slower_ttl_days: float = _knob(
        7.0, "Days a slower verdict lasts after its latest evidence; then jobs probe the cluster again.", minimum=0.0
    )
    # job identity (the admission webhook fills these from labels and the downward API)
    cluster: str = _knob("local", "Name of the Kubernetes cluster the job runs in (not a stitched cluster).")
    namespace: str = _knob("default", "Namespace of the job.")
    job_name: str = _knob("", "Job name (empty: derived from the script name).")
    job_uid: str = _knob("", "Id of this run of the job, shared by its ranks (Job uid/attempt; empty: a fresh uuid).")
    team: str = _knob("", "Owning team, for rollups.")
    model: str = _knob("", "Model name, for rollups.")
    pod_name: str = _knob("", "Pod name.")
    rank: int = _knob(0, "This process's rank (Horovod sets its own and wins).", minimum=0)
    world_size: int = _knob(1, "Number of ranks in the job.", minimum=1)
    gpus_per_rank: int = _knob(1, "GPUs each rank uses, for GPU-hour accounting.", minimum=0)
    gpu_type: str = _knob("", "GPU model, e.g. H200.")
    log_level: str = _knob("INFO", "Log level of stitchfleet's own logger.", choices=LOG_LEVELS)
    # operator and webhook
    webhook_port: int = _knob(8443, "HTTPS port of the mutating admission webhook.", minimum=1)
    webhook_tls_dir: Path = _knob(Path("/etc/stitchfleet/tls"), "Webhook TLS dir: tls.crt, tls.key, ca.crt.")  # noqa: RUF009
    webhook_self_signed: bool = _knob(True, "Make a self-signed CA and serving cert at start (false: cert-manager).")
    webhook_config_name: str = _knob("stitchfleet", "MutatingWebhookConfiguration whose caBundle the operator patches.")
    webhook_service: str = _knob("stitchfleet", "Service in front of the webhook (names in the serving cert).")
    operator_namespace: str = _knob("stitchfleet", "Namespace the operator runs in (downward API).")
    health_port: int = _knob(8080, "Port of the operator's /healthz endpoint.", minimum=1)
    rollup_seconds: float = _knob(300.0, "Seconds between fleet rollups (SavingsReports, gauges).", minimum=1.0)
    api_timeout_seconds: float = _knob(
        10.0, "Longest the operator waits on one of its own Kubernetes API calls.", minimum=0.1
    )
    shim_image: str = _knob(f"stitchfleet:{__version__}", "Image of the init container that copies the boot shim.")
    ingest_ca_configmap: str = _knob(
        "",
        "ConfigMap holding only the ingestion CA that the operator keeps current in each opted-in pod's namespace"
        " and the webhook mounts (STITCHFLEET_INGEST_CA_FILE) into the pods (empty: the CA reaches pods as a"
        " variable only).",
    )
    kernel_cache_claim: str = _knob(
        "",
        "PersistentVolumeClaim (in each job's namespace, ReadWriteMany across nodes) the webhook mounts as opted-in"
        " pods' kernel cache, so a job's pods share compiled clusters (empty: each pod's own emptyDir).",
    )

    @property
    def sqlite_path(self) -> Path:
        """The embedded default database file."""
        return self.state_dir / "telemetry.db"

    @property
    def database_url(self) -> str:
        """The URL telemetry connects to: db_url, else the SQLite file in state_dir."""
        return self.db_url or f"sqlite:///{self.sqlite_path}"

    @property
    def slower_ttl(self) -> dt.timedelta:
        """How long a slower verdict lasts after its latest evidence."""
        return dt.timedelta(days=self.slower_ttl_days)

    @property
    def spool_dir(self) -> Path:
        """Where rows wait while the database is unreachable."""
        return self.state_dir / "spool"


def env_name(field_name: str) -> str:
    """The environment variable behind a Settings field."""
    return PREFIX + field_name.upper()


def _parse_field(spec: dataclasses.Field[Any], raw: str) -> Any:
    name = env_name(spec.name)
    try:
        value = _PARSERS[str(spec.type)](raw)
    except ValueError as err:
        raise SettingsError(f"{name}={raw!r}: {err}") from None
    _validate(spec, name, value)
    return value


def _validate(spec: dataclasses.Field[Any], name: str, value: Any) -> None:
    choices = spec.metadata["choices"]
    if choices and value not in choices:
        raise SettingsError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    minimum = spec.metadata["minimum"]
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name}={value!r}: expected a value >= {minimum}")


def _unknown(environ: Mapping[str, str]) -> list[str]:
    known = {env_name(f.name) for f in dataclasses.fields(Settings)}
    return sorted(k for k in environ if k.startswith(PREFIX) and k not in known)


def load(environ: Mapping[str, str] | None = None, *, strict: bool = False) -> Settings:
    """Parses STITCHFLEET_* from `environ` (default os.environ) into Settings.

    With strict=True an unknown STITCHFLEET_* name is an error too (a typo would
    otherwise silently leave the default in place).
    """
    env = os.environ if environ is None else environ
    if strict and (unknown := _unknown(env)):
        raise SettingsError(f"unknown setting(s): {', '.join(unknown)}")
    values = {
        f.name: _parse_field(f, env[env_name(f.name)]) for f in dataclasses.fields(Settings) if env_name(f.name) in env
    }
    return Settings(**values)


_current: Settings | None = None


def current() -> Settings:
    """The process-wide settings, parsed from os.environ on first use."""
    global _current
    if _current is None:
        _current = load()
    return _current


def reset() -> None:
    """Forgets the cached settings (tests, and processes that change their env on purpose)."""
    global _current
    _current = None


# Each knob's area, in the order `stitchfleet settings` prints them: where to look for what a knob steers.
AREAS: dict[str, tuple[str, ...]] = {
    "plugin": (
        "enabled",
        "backend",
        "bridge",
        "device",
        "compile_budget",
        "compile_workers",
        "remote_stitch_budget",
        "signatures_max",
        "signature_steps",
        "signature_window",
        "signature_compile_seconds",
        "dump_dir",
        "cache_dir",
        "log_level",
    ),
    "guard": (
        "check_every",
        "check_first",
        "check_budget",
        "check_max_gap",
        "check_clusters",
        "tolerance_factor",
        "translation_check",
        "slowdown_margin",
    ),
    "probes": (
        "warmup_steps",
        "baseline_steps",
        "rebaseline_every",
        "paired_steps",
        "settle_steps",
        "window_steps",
        "probe_steps",
        "probe_margin",
        "probe_rounds",
        "probe_group",
        "probe_group_factor",
        "probe_reruns",
        "probe_min_steps",
        "probe_share",
        "job_steps",
        "step_ms",
        "setup_share",
        "holdout_every",
    ),
    "telemetry": (
        "db_url",
        "state_dir",
        "metrics_port",
        "flush_seconds",
        "ingest_url",
        "ingest_ca",
        "ingest_ca_file",
        "ingest_server_name",
        "ingest_token_file",
        "ingest_audience",
        "ingest_token_seconds",
        "ingest_timeout_seconds",
        "ingest_max_backoff_seconds",
        "ingest_batch_rows",
        "fleet_memory_timeout_seconds",
        "slower_jobs",
        "slower_ttl_days",
    ),
    "job identity": (
        "cluster",
        "namespace",
        "job_name",
        "job_uid",
        "team",
        "model",
        "pod_name",
        "rank",
        "world_size",
        "gpus_per_rank",
        "gpu_type",
    ),
    "operator": (
        "webhook_port",
        "webhook_tls_dir",
        "webhook_self_signed",
        "webhook_config_name",
        "webhook_service",
        "operator_namespace",
        "health_port",
        "rollup_seconds",
        "api_timeout_seconds",
        "shim_image",
        "ingest_ca_configmap",
        "kernel_cache_claim",
    ),
}


def area_of(field_name: str) -> str:
    """The area a knob belongs to (KeyError for a knob no area lists: `AREAS` must name every one)."""
    for area, names in AREAS.items():
        if field_name in names:
            return area
    raise KeyError(f"setting {field_name!r} is in no area of settings.AREAS")


def describe() -> list[tuple[str, str, str, str]]:
    """(variable, type, default, doc) for every knob, area by area: what `stitchfleet settings` prints."""
    rows = []
    order = [name for names in AREAS.values() for name in names]
    fields = sorted(dataclasses.fields(Settings), key=lambda spec: order.index(spec.name))
    for spec in fields:
        choices = spec.metadata["choices"]
        type_text = "|".join(choices) if choices else str(spec.type)
        rows.append((env_name(spec.name), type_text, str(spec.default), spec.metadata["doc"]))
    return rows
