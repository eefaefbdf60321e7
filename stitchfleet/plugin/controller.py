"""What the hook decides, step by step: switches, checks, windows, probes, reverts. TF-free.

Input: the compiled clusters (`Cluster`: fingerprint, kernel, guard figures), the timing
schedule, a `Ledger` and, per step, its duration, check results and the consensus vector.
Output: the switch vector of every step, the local figures each step contributes to the
consensus (bad flags per cluster, plugin fault, non-finite loss, the slowdown bracket's figures,
the medians of a finished probe pair, the group's and a cluster's), and every decision taken
from the summed figures: a mismatching or non-finite cluster is reverted for the rest of the
job (fleet verdict `reverted`); after the group probe (every cluster on vs plain TF) the group
is proven when it beat its paired baseline by more than the margin and the noise (a `probe`
event without a cluster: "group proven" or "group not faster"); after its probe pair (every
cluster still enabled on, with it and without it) a cluster is kept (event `cluster_enabled`,
verdict `enabled`) when the pair with it beat the pair without it by more than the margin and
the noise or, with the group proven, unless it was slower by more than those (small gains that
only the group can resolve), else it is left to TF
(event `probe`, verdict `disabled`: not sticky, a later job probes it again; not a revert,
so the weekly report's revert figures stay about faults); with no cluster kept
stitching is off for the job (a `probe` event without a cluster; the job ends `finished`);
a plugin fault, a non-finite loss or a slowdown beyond the margin and the noise (the stitched
steps right around a baseline window against that window: `slowdown.Bracket`) reverts the whole
job. Decisions use only the summed vector, so ranks that share it take the same decisions at the
same step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stitchfleet.plugin.guard import Finding
from stitchfleet.plugin.ledger import Ledger
from stitchfleet.plugin.schedule import (
    GROUP,
    PROBE,
    REFERENCE,
    REVERTED,
    STITCHED,
    Probes,
    Timing,
    Window,
    Windows,
    compared,
)
from stitchfleet.plugin.slowdown import Bracket

log = logging.getLogger("stitchfleet.plugin")
# fault, loss, fresh bracket, its stitched median, baseline median and noise (`slowdown`), probe figures in,
# probe with, probe without (or the group's baseline), probe noise, then the same four figures of the group
EXTRA = 14
GUARD, PROBED, GROUPED = slice(0, 6), slice(6, 10), slice(10, 14)  # the EXTRA figures, after the cluster flags
NOISE_FACTOR = 2.0  # a kept cluster beats its baseline by this many standard errors (and by the margin)


@dataclass
class Cluster:
    index: int
    fingerprint: str
    kernel: Any
    op_count: int
    enabled: bool = True
    reverted_at: int | None = None
    reason: str = ""
    kept: bool | None = None  # the probe's decision; None until taken
    probe: str = ""  # what the probe measured, e.g. "-0.41 ms/step (2.49 vs 2.90 ms, 9+10 steps)"


class Controller:
    def __init__(self, clusters: list[Cluster], timing: Timing, ledger: Ledger, size: int = 1) -> None:
        self.clusters, self.ledger, self.size = clusters, ledger, size
        self.timing = replace(timing, clusters=len(clusters))
        self.windows = Windows(timing.window_steps)
        self.probes = Probes(self.timing)
        self.job_reverted: str | None = None
        self.stitching_off: str | None = None
        self.pending: dict[int, Finding | str] = {}
        self.fault: str | None = None
        self.loss_bad = False
        # brackets of `baseline_steps` timed steps, adjacent within as many steps (checks leave holes)
        self.bracket = Bracket(max(timing.baseline_steps - 1, 1), max(timing.baseline_steps, 2))
        self.announced = self.timing.probing  # probed clusters are announced by their decision
        self.check_counts = [0] * len(clusters)
        self.job_seconds = 0.0  # every step's time, and what check steps took beyond a usual step
        self.check_seconds = 0.0
        self.last_check = 0  # the last step that judged a cluster: checks wait for the budget at most check_max_gap
        self.turn = 0  # periodic checks made so far (their rotation over the clusters)
        self.group_proven: bool | None = None  # the group probe's decision; None until taken (or without one)
        self.group_probe = ""  # what the group probe measured, in a cluster's `probe` format
        for c in clusters:
            c.kept = None if self.timing.probing else True

    @property
    def length(self) -> int:
        return len(self.clusters) + EXTRA

    def mode(self, step: int) -> str:
        phase = self.timing.phase(step)
        off = self.job_reverted is not None or (phase == STITCHED and self.stitching_off is not None)
        return REVERTED if off and phase in (STITCHED, PROBE, REFERENCE) else phase

    def switches(self, step: int) -> np.ndarray[Any, np.dtype[np.bool_]]:
        mode = self.mode(step)
        if mode == PROBE:  # the group, or every cluster still enabled with the probed one
            return np.array([c.enabled for c in self.clusters], dtype=bool)
        if mode == REFERENCE:  # every cluster still enabled but the probed one
            probed = self.timing.subject(step)
            return np.array([c.enabled and i != probed for i, c in enumerate(self.clusters)], dtype=bool)
        on = mode == STITCHED
        return np.array([on and c.enabled and bool(c.kept) for c in self.clusters], dtype=bool)

    def checks(self, step: int) -> bool:
        """A step that judges at least one cluster (see `judged`)."""
        return bool(self.judged(step))

    def judged(self, step: int) -> list[int]:
        """The clusters (positions) whose stitched outputs are compared with the reference at `step`.

        A probe window's check judges what it switched on (the probed cluster, or every cluster of the
        group). The stitched phase's first steps judge only clusters checked fewer than `check_first`
        times so far in this job (probe checks count: the code and its numerics did not change). A
        periodic check judges `check_clusters` of the clusters on, in rotation: each check costs 1-25 ms
        per cluster of numpy on the host, which a small step cannot pay for every cluster every time;
        and it is skipped while the checks so far took more than `check_budget` of the job's time
        (on a 3 ms CPU step a check every 100 steps is ~5% of the job; on a 100 ms GPU step, 0.2%), but
        never for more than `check_max_gap` steps since the last check: the budget delays checks, it cannot
        stop them, so a fault that starts late is judged within a bounded number of steps (see Timing).
        """
        if not self.timing.checks(step):
            return []
        on = [k for k, s in enumerate(self.switches(step)) if s]
        if self.mode(step) != STITCHED:  # a probe window: what it switched on, until checked enough
            return [k for k in on if self.check_counts[k] < self.timing.check_first]
        if self.timing.first_checks(step):
            fresh = [k for k in on if self.check_counts[k] < self.timing.check_first]
            if fresh or step % self.timing.check_every:
                return fresh
        over_budget = self.check_seconds > self.timing.check_budget * self.job_seconds
        if over_budget and step - self.last_check < self.timing.check_max_gap:
            return []
        return [on[j] for j in self.timing.rotation(self.turn, len(on))]

    def count_checks(self, judged: list[int], step: int | None = None) -> None:
        """Books the clusters a step judged (the hook calls this once per step, before it runs)."""
        for k in judged:
            self.check_counts[k] += 1
        if judged and step is not None:
            self.last_check = step
            if self.mode(step) == STITCHED and not self.timing.first_checks(step):
                self.turn += 1  # a periodic check was made: the rotation moves on

    def local(self, step: int) -> np.ndarray[Any, np.dtype[np.float64]]:
        """This rank's figures for `step`, about to run (see the module docstring)."""
        flags = [float(i in self.pending or c.kernel.bad is not None) for i, c in enumerate(self.clusters)]
        bracket = self.bracket.take()
        slowdown = [1.0, *bracket] if bracket is not None else [0.0, 0.0, 0.0, 0.0]
        extra = [float(self.fault is not None), float(self.loss_bad), *slowdown]
        cluster = self._probe_figures(self.timing.decides(step))
        group = self._probe_figures(GROUP if self.timing.decides_group(step) else None)
        return np.array(flags + extra + cluster + group, dtype=np.float64)

    def _probe_figures(self, k: int | None) -> list[float]:
        """For the cluster (or GROUP) decided now: [1, switched-on median, paired baseline median, noise];
        zeros when nothing is decided or this rank has not timed both halves."""
        found = self.probes.medians(k) if k is not None else None
        if k is None or found is None:
            return [0.0, 0.0, 0.0, 0.0]
        return [1.0, *found, self.probes.noise(k)]

    # --- after a step ---------------------------------------------------------------------

    def timed(self, step: int, seconds: float, checked: bool) -> None:
        """Books the step's time; closed windows become StepWindow rows."""
        mode = self.mode(step)
        if mode == STITCHED and not self.announced:
            self._announce(step)
        self.probes.add(step, seconds, timed=not checked)
        self.job_seconds += seconds
        if checked:
            usual = self.windows.stitched_median or self.windows.baseline_median or 0.0
            self.check_seconds += max(seconds - usual, 0.0)
        else:
            self.bracket.add(step, mode, seconds)
        for window in self.windows.add(step, mode, seconds, timed=not checked):
            self._record(window)

    def _announce(self, step: int) -> None:
        self.announced = True
        for c in self.clusters:
            if c.enabled:
                self.ledger.event("cluster_enabled", step, c.fingerprint, "stitched path on")
                self.ledger.verdict(c.fingerprint, "enabled", op_count=c.op_count)

    def _record(self, window: Window) -> None:
        self.ledger.window(
            window_index=window.index,
            first_step=window.first_step,
            last_step=window.last_step,
            iterations=window.iterations,
            mode=window.row_mode,
            step_seconds_sum=sum(window.seconds),
            baseline_step_seconds=window.baseline,
            saved_seconds=window.saved_seconds,
        )

    def checked(self, step: int, index: int, finding: Finding) -> None:
        if not finding.ok:
            self.pending.setdefault(index, finding)
            c = self.clusters[index]
            figures = _figures(finding)
            self.ledger.event("guard_check", step, c.fingerprint, "mismatch", passed=False, **figures)

    def decide(self, step: int, summed: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        """Applies the summed figures of `step`; the new switches hold from the next step."""
        n = len(self.clusters)
        for i, c in enumerate(self.clusters):
            if summed[i] > 0 and c.enabled:
                self._revert_cluster(step, c, self.pending.get(i) or c.kernel.bad or "reverted on another rank")
        extra = summed[n:]
        self._guard_job(step, extra[GUARD])
        if self.timing.decides_group(step) and self.job_reverted is None:
            self._group_decision(step, extra[GROUPED])
        probed = self.timing.decides(step)
        if probed is not None and self.job_reverted is None:
            self._probe_decision(step, self.clusters[probed], extra[PROBED])
            if probed == n - 1:
                self._settle(step)

    def _guard_job(self, step: int, figures: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        """Job-wide reverts from the summed fault, loss and (rank-summed) bracket figures: a slowdown must
        exceed both the margin and NOISE_FACTOR standard errors (`slowdown.Bracket`)."""
        fault, loss, fresh, stitched, base, noise = figures
        if fault > 0:
            self._revert_job(step, "plugin error", self.fault or "a plugin error on another rank")
        elif loss > 0:
            self._revert_job(step, "non-finite loss", "the loss was NaN/Inf on a stitched step")
        elif fresh >= self.size and self._stitching:
            mean_s, mean_b, mean_n = stitched / self.size, base / self.size, noise / self.size
            if mean_s - mean_b > max(mean_b * self.timing.slowdown_margin, NOISE_FACTOR * mean_n):
                detail = f"stitched median {mean_s:.6f} s vs baseline {mean_b:.6f} s per step (noise {mean_n:.6f} s)"
                self._revert_job(step, "slowdown", detail)

    # --- probe decisions --------------------------------------------------------------------
    # The figures compared are the ranks' means of their own medians, the same on every rank.

    def _group_decision(self, step: int, figures: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        """Proves the group (every cluster on) or not, from the summed group figures."""
        ready, on, base, noise = (float(x) for x in figures)
        if ready < self.size:
            self.group_proven = False
            self.group_probe = f"no group figures: {ready:.0f} of {self.size} ranks had timed both windows"
        else:
            on, base, noise = on / self.size, base / self.size, noise / self.size
            self.group_probe = self._describe(GROUP, on, base, noise)
            self.group_proven = base - on > self._needed(base, noise)
        label = "group proven" if self.group_proven else "group not faster"
        log.info("stitchfleet: %s at step %d: %s", label, step, self.group_probe)
        self.ledger.event("probe", step, None, label, detail=f"{label}: {self.group_probe}")

    def _probe_decision(self, step: int, c: Cluster, figures: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        """Keeps `c` or leaves it to TF from the summed probe figures (ready ranks, the enabled clusters' step
        with `c` on, the same without it, noise)."""
        if not c.enabled:
            return  # reverted already (its own revert event says why)
        ready, with_it, without, noise = (float(x) for x in figures)
        if ready < self.size:
            self._leave(step, c, "no probe figures", f"{ready:.0f} of {self.size} ranks had timed both windows")
            return
        with_it, without, noise = with_it / self.size, without / self.size, noise / self.size
        c.probe = self._describe(self.clusters.index(c), with_it, without, noise)
        needed = self._needed(without, noise)
        if self.group_proven:
            # the group's gain is real, and a cluster's small share of it is below one probe's noise: the
            # burden of proof flips, and only a cluster shown slower beyond the same bar is dropped
            if with_it - without > needed:
                self._leave(step, c, "slower than TF", c.probe)
            else:
                self._keep(step, c, "kept with the group")
        elif without - with_it > needed:
            self._keep(step, c, "faster than TF")
        elif with_it >= without:
            self._leave(step, c, "slower than TF", c.probe)
        else:
            self._leave(step, c, "not faster beyond noise and margin", c.probe)

    def _needed(self, base: float, noise: float) -> float:
        """The difference a probe must show: the margin (worth the risk) and the noise (not a lucky draw:
        keeping the clusters whose noise happened to be most negative made the kept set slower together
        than apart)."""
        return max(base * self.timing.probe_margin, NOISE_FACTOR * noise)

    def _describe(self, subject: int, on: float, base: float, noise: float) -> str:
        """A probe's figures, e.g. "-0.41 ms/step (2.49 vs 2.90 ms, 9+10 steps, noise 0.05 ms)": this rank's
        timed steps switched on + baseline (check steps are not timed)."""
        counts = [len(self.probes.seconds.get((subject, mode), [])) for mode in (PROBE, compared(subject))]
        steps = f"{counts[0]}+{counts[1]} steps"
        return (
            f"{(on - base) * 1e3:+.2f} ms/step ({on * 1e3:.2f} vs {base * 1e3:.2f} ms, {steps},"
            f" noise {noise * 1e3:.2f} ms)"
        )

    def _keep(self, step: int, c: Cluster, label: str) -> None:
        c.kept, c.reason = True, f"{label}: {c.probe}"
        log.info("stitchfleet: cluster %d kept at step %d: %s", c.index, step, c.reason)
        self.ledger.event("cluster_enabled", step, c.fingerprint, label, detail=c.reason)
        self.ledger.verdict(c.fingerprint, "enabled", c.reason, c.op_count)

    def _leave(self, step: int, c: Cluster, label: str, detail: str) -> None:
        c.kept, c.enabled, c.reason = False, False, f"{label}: {detail}"
        log.info("stitchfleet: cluster %d left to TF at step %d: %s", c.index, step, c.reason)
        self.ledger.event("probe", step, c.fingerprint, label, detail=c.reason)
        self.ledger.verdict(c.fingerprint, "disabled", c.reason, c.op_count)

    def _settle(self, step: int) -> None:
        """After the last probe: with no cluster kept, stitching is off for the job (not an error)."""
        if any(c.enabled and c.kept for c in self.clusters):
            return
        self.stitching_off = "no cluster kept: none passed its probe; the job runs TF's own ops"
        log.info("stitchfleet: stitching off for the job at step %d: %s", step, self.stitching_off)
        self.ledger.event("probe", step, None, "no cluster kept", detail=self.stitching_off)

    @property
    def done(self) -> bool:
        """No cluster can run stitched again in this job (the job reverted, no cluster kept, or every one
        reverted): nothing is left to decide, so the hook stops adding anything to the job's steps. Every
        rank sees it at the same step, since it follows from the summed decisions only."""
        over = self.job_reverted is not None or self.stitching_off is not None
        return over or not any(c.enabled for c in self.clusters)

    @property
    def _stitching(self) -> bool:
        """Whether any cluster can still run stitched: with none on, a slow step is not the plugin's doing
        (regression: a job whose probes kept nothing was reverted "for slowdown" on one noisy step)."""
        return self.stitching_off is None and any(c.enabled for c in self.clusters)

    def _revert_cluster(self, step: int, c: Cluster, why: Finding | str) -> None:
        c.enabled, c.reverted_at = False, step
        reason = "mismatch" if isinstance(why, Finding) else why
        figures = _figures(why) if isinstance(why, Finding) else {}
        detail = why.reason if isinstance(why, Finding) else why
        c.reason = f"{reason}: {detail}" if isinstance(why, Finding) else why  # a text is said once, not twice
        log.warning("stitchfleet: cluster %d reverted at step %d: %s", c.index, step, c.reason)
        self.ledger.event("revert", step, c.fingerprint, reason, detail=detail, **figures)
        self.ledger.verdict(c.fingerprint, "reverted", c.reason, c.op_count)

    def _revert_job(self, step: int, reason: str, detail: str) -> None:
        if self.job_reverted is not None:
            return
        self.job_reverted = f"{reason}: {detail}"
        log.warning("stitchfleet: stitching reverted for the job at step %d: %s", step, self.job_reverted)
        self.ledger.event("revert", step, None, reason, detail=detail)

    def finish(self) -> None:
        window = self.windows.close()
        if window is not None:
            self._record(window)
        reverted = [c for c in self.clusters if c.reverted_at is not None]
        if self.job_reverted is not None:
            self.ledger.finished("reverted", self.job_reverted)
            return
        notes = [self.stitching_off] if self.stitching_off else []
        if self.timing.probing:
            notes.append(f"probe kept {sum(bool(c.kept) for c in self.clusters)}/{len(self.clusters)} clusters")
        if self.group_proven is not None:
            notes.append("group proven" if self.group_proven else "group not faster")
        notes += [f"cluster {c.index} {c.reason}" for c in reverted]
        self.ledger.finished("finished", "; ".join(notes))


def _figures(finding: Finding) -> dict[str, Any]:
    error = finding.compiled_error
    return {"max_abs_error": error if np.isfinite(error) else None, "error_ratio": finding.ratio}
