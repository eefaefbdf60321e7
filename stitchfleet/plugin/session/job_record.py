"""What the hook writes to its job's telemetry: the ledger opened, events as they happen, the job's end.

Input: the settings, the job's ranks and database URL, then the hook's events (a setup, a cluster left off, a
failure) and at `end` what the job's run decided (its controller, its graph's key, its shape signatures).
Output: rows in the job's `Ledger`; nothing here fails the job (a record that cannot be written is logged).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from stitchfleet import settings as settings_module
from stitchfleet.plugin.fleet import ledger as ledger_module
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.telemetry.kinds import EventKind

if TYPE_CHECKING:
    from stitchfleet.plugin.control.controller import Controller
    from stitchfleet.plugin.native.kernels import ClusterKernel
    from stitchfleet.plugin.shapes.signature_kernels import SignatureKernels
    from stitchfleet.plugin.shapes.signatures import Specialisation

log = logging.getLogger("stitchfleet.plugin")


def opened(current: settings_module.Settings, rank: int, size: int, db_url: str | None) -> Ledger:
    """The job's telemetry at `begin`, started (the hook keeps the one it was handed: `record`)."""
    record = Ledger(current, rank, size, db_url)
    record.started()
    return record


def event(record: Ledger | None, kind: str, fingerprint: str | None, reason: str, detail: str) -> None:
    """One event of the job (none without a ledger: a session left as written before its telemetry opened)."""
    if record is not None:
        record.event(kind, None, fingerprint, reason, detail=detail)


def setup_failed(
    record: Ledger | None, current: settings_module.Settings, ranks: tuple[int, int], db_url: str | None, err: Exception
) -> Ledger | None:
    """A setup that raised: recorded all the same, under this rank (in a ledger of its own when it failed before
    the job's was opened). Returns the job's ledger."""
    if record is None:
        record = ledger_module.opened(current, *ranks, db_url)
    event(record, "compile_failure", None, f"plugin setup failed: {type(err).__name__}", str(err))
    return record


def set_up(record: Ledger, seconds: float, installed: int, off: int, built: str) -> None:
    """A setup that ran to its end: its seconds, and how many clusters it stitched."""
    record.compiled(seconds)
    log.info("stitchfleet: %d cluster(s) stitched, %d left off; %s", installed, off, built)
    event(record, EventKind.SETUP.value, None, f"setup {seconds:.2f} s", built)


def not_attached(record: Ledger | None, current: settings_module.Settings, db_url: str | None, reason: str) -> None:
    """A job whose training steps run without the hook (a session it cannot join), and why; `record`: a waiting
    session's ledger, if it had one."""
    record = record or ledger_module.opened(current, 0, 1, db_url)
    try:
        if record is not None:
            record.event(EventKind.NOT_ATTACHED.value, None, None, "not attached", detail=reason)
            record.close()
    except Exception as err:  # the job runs on whatever happens here
        log.warning("stitchfleet: could not record that the hook is not attached: %s", err)


def closed(
    record: Ledger | None,
    controller: Controller | None,
    job_key: tuple[str, str, str] | None,
    shapes: Specialisation | None,
    ended: tuple[int, list[ClusterKernel], SignatureKernels | None],
) -> None:
    """The job's end: its controller's last windows, the verdict on its graph for the fleet's memory, the shape
    signatures it was fed (`ended`: its steps, the installed clusters' kernels, the kernels per signature); then
    the ledger is closed."""
    try:
        if controller is not None:
            controller.finish()
            if job_key is not None and record is not None:
                # Only a job whose setup ran has a key, so the setup's modules are loaded already.
                from stitchfleet.plugin.setup import job_verdict

                decisions = controller.decisions
                job_verdict.record(record, job_key, controller.course, decisions.group_proven, decisions.group_finding)
        if shapes is not None and record is not None:
            shapes.finished(record, *ended)
    except Exception:
        log.exception("stitchfleet: could not close the job's telemetry")
    if record is not None:
        record.close()


def remembered(
    current: settings_module.Settings, controller: Controller, ranks: int, record: tuple[str, str, bool, float]
) -> None:
    """After `closed`: what the job's run measured (`setup.last_run`), added to its setup's record in the kernel cache
    for its next run's payback estimate on this node (`setup_record.Measured`). `record`: the setup's (record key,
    backend, whether every kernel came from the cache, the seconds the cache spares a warm run: `job_setup.Setup`). A
    Horovod job adds nothing: its ranks' nodes hold different caches, and every rank must take the same decision."""
    key, backend, warm, cold = record
    if ranks != 1 or not key:
        return
    try:
        from stitchfleet.plugin.setup import last_run, setup_record

        figures = last_run.figures(controller, warm_cost(controller, warm, cold))
        if figures is not None and setup_record.remember(current.cache_dir, key, backend, figures):
            log.info("stitchfleet: for this job's next run here: %s", figures.said())
    except Exception:  # a figure for the next run is never worth a failure
        log.exception("stitchfleet: could not record what this job measured for its next run")


def warm_cost(controller: Controller, warm: bool, cold: float) -> float:
    """What a warm run of the job pays again, from this run: the executor builds, the kernels' first runs, the plugin's
    work no saving pays, and the setup itself, less (a cold run) `cold`, its compiles and translation checks, which the
    cache spares the next run. Not the whole setup less: the corpus BERT's cold run so said 1.1 s, and the warm run it
    let set up paid 2.4 s and lost (session 28)."""
    from stitchfleet.plugin.control.plugin_cost import PluginCost

    spared = 0.0 if warm else min(cold, controller.setup_seconds)
    return controller.setup_total - spared + PluginCost.of(controller).overhead
