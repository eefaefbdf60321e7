"""What a job's setup left in the kernel cache, so that its next run knows what its setup will cost there.

Input: the job's graph, backend and settings; after a setup, the kernels it built (`ClusterKernel`s); at the job's
end, what its stitched phase measured (`Measured`); before a setup, the kernel cache directory. Output: `write` puts
`<cache>/setups/<key>.json` (the kernels' files, and the code, CPU and C compiler that built them), `remember` adds
the measured figures to it; `CacheState` says how much of it the cache holds now and what the last run measured
(`recall`), which `payback.estimate` turns into the setup's cost and gain. Rules: docs/plugin/setup.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from stitchfleet import settings as settings_module

if TYPE_CHECKING:
    import tensorflow as tf

RECORD_DIR = "setups"
PACKAGE = Path(__file__).resolve().parents[2]  # stitchfleet/
CODE_DIRS = ("compiler", "plugin")  # what decides a job's clusters, their C and the op (csrc included)
STEADY, GROUP, SLOWDOWN = "steady", "group", "slowdown"  # what a run's `Measured` figure is (its `source`)
NOISE_WIDTH = 2.0  # standard errors a steady gain is discounted by (`Measured.expected`): the report's 95% rule


@functools.cache
def code_digest() -> str:
    """sha256 over every file of the compiler and the plugin (relative path and bytes), read once per process:
    a record written by other code says nothing of which kernels this code builds."""
    digest = hashlib.sha256()
    for folder in CODE_DIRS:
        for path in sorted((PACKAGE / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def builder(backend: str, cache_dir: Path) -> dict[str, str] | None:
    """What the kernels' cache keys depend on beside their source: this code, and what the backend's target says
    (cpu: this CPU, as -march=native compiles for it, the C compiler, its flags); None for a backend whose kernels
    are no files a setup records."""
    from stitchfleet.compiler import targets

    try:
        made = targets.native(backend, Path(cache_dir)).builder()
    except (ImportError, KeyError, ValueError):
        return None
    return None if made is None else {"code": code_digest(), **made}


def record_key(graph: tf.Graph, backend: str, current: settings_module.Settings) -> str:
    """The record's name: the graph's identity across runs (`graph_identity.graph_key`), the backend and the
    settings that change the clusters drawn (remote stitching's budget)."""
    from stitchfleet.plugin.graph.graph_identity import graph_key

    blob = json.dumps([graph_key(graph), backend, current.remote_stitch_budget])
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


def state(graph: tf.Graph, backend: str, current: settings_module.Settings) -> CacheState:
    """What the kernel cache holds of this job's last setup (`recall`), and whether its native op is there or not
    needed (the `python` bridge, a backend without the op)."""
    from stitchfleet.compiler import targets
    from stitchfleet.plugin.native import dispatch_op

    needed = current.bridge != "python" and targets.profile(backend).native_op
    op = not needed or dispatch_op.present(current.cache_dir)
    return recall(current.cache_dir, record_key(graph, backend, current), backend, op)


def _path(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / RECORD_DIR / f"{key}.json"


def _kernel_file(kernel: object, cache_dir: Path) -> str | None:
    """The kernel's shared object, relative to the cache directory; None when it is no file there."""
    library = getattr(getattr(kernel, "executable", None), "library_path", None)
    if library is None:
        return None
    try:
        return str(Path(library).resolve().relative_to(Path(cache_dir).resolve()))
    except ValueError:
        return None


def write(cache_dir: Path, key: str, backend: str, kernels: Iterable[object]) -> bool:
    """Records the kernels a setup built (atomic rename: a concurrent pod reads a whole record or none).
    Nothing raises: without a record the next run only estimates its setup as cold. False when not written."""
    made = builder(backend, cache_dir)
    found = [_kernel_file(kernel, cache_dir) for kernel in kernels]
    files = [name for name in found if name is not None]
    if made is None or not files or len(files) < len(found):
        return False
    doc: dict[str, object] = {**made, "kernels": sorted(set(files))}
    before = _read(cache_dir, key)
    if before is not None and before.get("measured") is not None and _made(before) == made:
        doc["measured"] = before["measured"]  # the same code's kernels: what their last run measured still holds
    return _replace(cache_dir, key, doc)


def _read(cache_dir: Path, key: str) -> dict[str, object] | None:
    try:
        doc = json.loads(_path(cache_dir, key).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _made(doc: dict[str, object]) -> dict[str, str]:
    return {name: str(value) for name, value in doc.items() if name not in ("kernels", "measured")}


def _replace(cache_dir: Path, key: str, doc: dict[str, object]) -> bool:
    """Writes the record whole (atomic rename: a concurrent pod reads a whole record or none)."""
    target = _path(cache_dir, key)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out)
        Path(temporary).replace(target)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Measured:
    """What the job's last run measured on this node (`setup.last_run`): `gain`, the share of plain TF's step saved
    (negative: lost) over `steps` steps by its steady stitched steps (`source`), or its group probe or the slowdown
    guard's figure when its stitching ended off without them (`noise`: its standard error, a share of the step);
    `per_run`, the seconds beyond plain TF a warm run pays again (executor builds, the kernels' first runs, the
    plugin's work no saving pays, a setup from the cache); `skips`, runs that skipped on it (`payback.RETRY_AFTER`);
    `plain_step`, the user's graph's step in seconds as its baseline blocks ran it (0: not measured), the step time a
    next run weighs its setup by when no one states it (`payback.estimate`); `readings`, the runs' group probes pooled
    in it (`pooled`); `setups`, runs that set up on it since the last holdout (STITCHFLEET_HOLDOUT_EVERY)."""

    gain: float
    steps: int
    per_run: float
    source: str = STEADY
    noise: float = 0.0
    skips: int = 0
    plain_step: float = 0.0
    readings: int = 1
    setups: int = 0

    @property
    def within(self) -> bool:
        """A group reading no slower than plain TF beyond its noise: no finding either way (the fleet told nothing)."""
        return self.source == GROUP and self.gain >= -NOISE_WIDTH * self.noise

    def expected(self, margin: float = 0.0) -> float:
        """The share of plain TF's step a next run's stitched phase can expect: a steady gain less twice its noise
        (the report claims only a saving whose 95% interval excludes zero; one run's gain within its noise is no
        gain to set up for: the corpus BERT's warm run set up on one cold run's figure and lost 1.18x). After
        stitching ended off: the gain a group reading within its noise leaves possible (its upper bound) when that
        bound passes the probe's `margin` (exploring again adds a reading to the pool, whose noise shrinks, so the
        re-probes stop once the bound cannot repay them), else at most 0 (a loss beyond the noise, the slowdown
        guard's, or a gain no rerun could prove)."""
        if self.source == STEADY:
            return self.gain - NOISE_WIDTH * self.noise if self.gain > 0 else self.gain
        bound = self.gain + NOISE_WIDTH * self.noise
        return bound if self.within and bound > margin else min(self.gain, 0.0)

    def said(self) -> str:
        paid = f"paid {self.per_run:.1f} s a warm run pays again"
        if self.source == GROUP:
            runs, probes = (
                (f"its last {self.readings} runs", "probes") if self.readings > 1 else ("its last run", "probe")
            )
            best = _versus(self.gain + NOISE_WIDTH * self.noise)
            bound = f"within its noise ({best} at best), " if self.within else ""
            probe = f"({self.steps} steps, noise {self.noise:.1%}): {bound}not faster, stitching went off"
            return (
                f"{runs} here measured every cluster on {_versus(self.gain)} in its group {probes} {probe}; it {paid}"
            )
        if self.source == SLOWDOWN:
            found = f"was reverted by the slowdown guard: its stitched steps {_versus(self.gain)}"
            return f"its last run here {found} (noise {self.noise:.1%}); it {paid}"
        noise = f" (noise {self.noise:.1%}: {_versus(self.expected())} expected)" if self.noise > 0 else ""
        return f"its last run here ran {self.steps} stitched steps {_versus(self.gain)}{noise} and {paid}"


def _versus(gain: float) -> str:
    """A share of plain TF's step saved, in words: a signed share read "-4.0% of plain TF's step" as a gain."""
    way = "as fast as" if round(gain, 3) == 0 else f"{abs(gain):.1%} {'faster' if gain > 0 else 'slower'} than"
    return f"{way} plain TF's step"


@dataclass(frozen=True)
class CacheState:
    """How much of a job's last setup the kernel cache holds: `kernels` it built (0: none known), `present` of them
    there now, whether the native op is there (or not needed), the sentence that says so, what the job's last run
    measured (`Measured`; None when none is recorded) and the record's key (`record_key`)."""

    kernels: int
    present: int
    op: bool
    why: str
    measured: Measured | None = None
    key: str = ""

    @property
    def missing(self) -> float:
        """The share of the job's kernels its setup compiles: 1 when the cache knows none of them."""
        return 1.0 if self.kernels == 0 else (self.kernels - self.present) / self.kernels

    @property
    def case(self) -> str:
        """warm (every kernel there), partly warm, or cold (none)."""
        if self.missing == 0:
            return "warm"
        return "cold" if self.present == 0 else "partly warm"


def recall(cache_dir: Path, key: str, backend: str, op: bool) -> CacheState:
    """What the cache holds of the job's last setup recorded under `key` (`op`: whether the native op is there
    or not needed). No record, an unreadable one, or one written by other code, for another CPU or by another
    C compiler: cold (its kernels' keys would differ)."""
    doc = _read(cache_dir, key)
    kernels = doc.get("kernels") if doc is not None else None
    if doc is None or not isinstance(kernels, list):
        return CacheState(0, 0, op, "no earlier setup of this job's graph is recorded in the kernel cache")
    files, made = [str(name) for name in kernels], _made(doc)
    current = builder(backend, cache_dir)
    if current != made:
        what = {"code": "other stitchfleet code", "machine": "another CPU", "cc": "another C compiler"}
        changed = [name for name in {**made, **(current or {})} if (current or {}).get(name) != made.get(name)]
        by = what.get(changed[0], f"other {changed[0]}")
        return CacheState(0, 0, op, f"the cache's kernels of this job were built by {by}")
    present = sum((Path(cache_dir) / name).is_file() for name in files)
    why = f"the kernel cache holds {present} of the {len(files)} kernels this job's last setup built"
    return CacheState(len(files), present, op, why, _measured(doc.get("measured")), key)


def _measured(found: object) -> Measured | None:
    """The record's measured figures, or None when it has none or they do not read as such (a record written before
    `source`, `noise` and `skips` holds a steady gain; one written before `plain_step` measured none)."""
    if not isinstance(found, dict):
        return None
    try:
        extra = (str(found.get("source", STEADY)), float(found.get("noise", 0.0)), int(found.get("skips", 0)))
        plain, readings = float(found.get("plain_step", 0.0)), int(found.get("readings", 1))
        figures = (float(found["gain"]), int(found["steps"]), float(found["per_run"]), *extra, plain, readings)
        measured = Measured(*figures, int(found.get("setups", 0)))
    except (KeyError, TypeError, ValueError):
        return None
    finite = (measured.gain, measured.per_run, measured.noise, measured.plain_step)
    counts = measured.readings >= 1 and measured.setups >= 0
    sound = all(map(math.isfinite, finite)) and measured.plain_step >= 0 and counts
    return measured if sound and measured.source in (STEADY, GROUP, SLOWDOWN) else None


# Fewer paired steady stitched steps than this say too little of the steady gain to weigh a next run's setup by.
MIN_STEADY_STEPS = 50


def measured(gain: float | None, steps: int, per_run: float, noise: float = 0.0) -> Measured | None:
    """A run's figures for its next run (`Measured`, `noise` the gain's standard error), or None when its steady
    stitched steps were too few to say."""
    if gain is None or steps < MIN_STEADY_STEPS or not math.isfinite(gain):
        return None
    return Measured(gain, steps, per_run, STEADY, noise if math.isfinite(noise) else 0.0)


def remember(cache_dir: Path, key: str, backend: str, measured: Measured) -> bool:
    """Adds what the job's run measured to its setup's record (`pooled` with a group reading there), for its next run's
    payback estimate; only to a record this code, CPU and compiler wrote (another's kernels say nothing of this one's
    gain). The runs counted since the last holdout stay counted (a fresh figure starts no new turn). False when not
    written."""
    doc = _read(cache_dir, key)
    if doc is None or _made(doc) != builder(backend, cache_dir):
        return False
    before = _measured(doc.get("measured"))
    fresh = replace(pooled(before, measured), setups=before.setups if before is not None else 0)
    return _replace(cache_dir, key, {**doc, "measured": asdict(fresh)})


def pooled(before: Measured | None, reading: Measured) -> Measured:
    """`reading` pooled with the record's `before` when both are group readings within their noise (`within`): the
    mean weighed by inverse variance, its smaller noise, the steps and readings summed. Else `reading` alone: a
    finding beyond the noise (either one), or a steady or slowdown figure, starts the record afresh."""
    if before is None or not (before.within and reading.within) or min(before.noise, reading.noise) <= 0:
        return reading
    weights = (before.noise**-2, reading.noise**-2)
    gain = (before.gain * weights[0] + reading.gain * weights[1]) / sum(weights)
    return replace(
        reading,
        gain=gain,
        steps=before.steps + reading.steps,
        noise=sum(weights) ** -0.5,
        readings=before.readings + reading.readings,
    )


def tally(cache_dir: Path, key: str, backend: str, skipped: bool, held_out: bool = False) -> bool:
    """Counts a run that weighed the record's figures: a skip adds one to `skips` (`payback.RETRY_AFTER`); a setup
    restarts them at 0 and adds one to `setups` (STITCHFLEET_HOLDOUT_EVERY: `job_length.holdout`); a holdout restarts
    both. The figures themselves stay as they are. Written when a count changes; a concurrent pod's count may be lost.
    False when not written."""
    doc = _read(cache_dir, key)
    found = _measured(doc.get("measured")) if doc is not None else None
    if doc is None or found is None or _made(doc) != builder(backend, cache_dir):
        return False
    if held_out:
        counted = replace(found, skips=0, setups=0)
    else:
        counted = replace(found, skips=found.skips + 1) if skipped else replace(found, skips=0, setups=found.setups + 1)
    if counted == found:
        return False
    return _replace(cache_dir, key, {**doc, "measured": asdict(counted)})
