"""`stitchfleet fleet recheck FINGERPRINT`: a quarantined cluster's revert judged again, offline.

Input: a fingerprint, the telemetry database, who asks and why (and a blob file when the revert's evidence was
too large to keep inline). Output: The rules in full: docs/plugin/guard.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stitchfleet.plugin.guard import evidence
from stitchfleet.plugin.guard.numeric import Finding
from stitchfleet.telemetry import database, fleet_quarantine, queries


@dataclass
class Rechecked:
    fingerprint: str
    findings: list[Finding] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # reverts whose evidence could not be judged, and why
    cleared: bool = False

    @property
    def passed(self) -> bool:
        return bool(self.findings) and not self.missing and all(f.ok for f in self.findings)

    def describe(self) -> str:
        lines = [f"{self.fingerprint}: {len(self.findings)} revert(s) judged again in float64"]
        lines += [f"  {'pass' if f.ok else 'MISMATCH'}: {f.reason}" for f in self.findings]
        lines += [f"  not judged: {why}" for why in self.missing]
        verdict = "quarantine cleared" if self.cleared else "quarantine kept"
        return "\n".join([*lines, f"  {verdict}"])


def recheck(fingerprint: str, url: str | None, by: str, why: str, blob: Path | None = None) -> Rechecked:
    """Judges every revert of `fingerprint` that kept evidence again and clears its quarantine when all pass
    (a revert without evidence, or whose blob is gone, keeps it: nothing is cleared on no evidence)."""
    engine = database.connect(url)
    try:
        reverts = queries.reverts_of(fingerprint, engine)
        done = Rechecked(fingerprint)
        if not reverts:
            done.missing.append("no revert of this fingerprint in the database")
        for revert in reverts:
            doc = evidence.parsed(revert.detail)
            if doc is None:
                done.missing.append(f"{revert.namespace}/{revert.job_name}: its revert kept no evidence")
                continue
            try:
                done.findings.append(evidence.recheck(evidence.loaded(doc, blob)))
            except (ValueError, KeyError, OSError) as err:
                done.missing.append(f"{revert.namespace}/{revert.job_name}: {err}")
        if done.passed:
            # the fleet's own clear (telemetry.fleet_quarantine): a `cleared` standing and its audit Event
            said = f"{why} (recheck passed for {len(done.findings)} revert(s) in float64)"
            fleet_quarantine.clear(engine, fingerprint, actor=by, why=said, cluster=reverts[0].cluster)
            done.cleared = True
        return done
    finally:
        engine.dispose()
