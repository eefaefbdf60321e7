"""Runs a corpus program (from $STITCHFLEET_CORPUS_DIR) plain and under the boot shim, and reads what the shim did.

Input: a program's file name, its step cap, a scratch directory. Output: `Outcome` per run (finished, the
per-step losses it printed) and, for the shimmed run, `Telemetry` read from its SQLite ledger (clusters
installed, refused and why, reverted, booked iterations) and the translation checks the hook made.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from stitchfleet.telemetry import models as tables
from stitchfleet.telemetry import spool_ingest
from tests.shared_cache import kernel_cache

ROOT = Path(__file__).resolve().parents[2]
# Other people's programs are never committed here (their code stays in their repositories): the corpus is a
# directory of adapted copies outside the checkout, named by this variable (README.md lists what it holds).
CORPUS_DIR = "STITCHFLEET_CORPUS_DIR"
PROGRAMS: Path | None = Path(os.environ[CORPUS_DIR]) if os.environ.get(CORPUS_DIR) else None
LOSS = re.compile(r"^CORPUS_LOSS (\d+) (\S+)$", re.MULTILINE)
STITCHED = re.compile(r"stitchfleet: (\d+) cluster\(s\) stitched, (\d+) left off")
# The harness' settings: clusters on after a short warmup and baseline, every cluster judged every 5 steps.
SHIM = {
    "STITCHFLEET_WARMUP_STEPS": "2",
    "STITCHFLEET_BASELINE_STEPS": "3",
    "STITCHFLEET_PROBE_STEPS": "0",
    "STITCHFLEET_SLOWDOWN_MARGIN": "1000",  # speed is not what the corpus measures
    "STITCHFLEET_CHECK_EVERY": "5",
    "STITCHFLEET_CHECK_BUDGET": "1.0",
    "STITCHFLEET_CHECK_MAX_GAP": "5",
    "STITCHFLEET_CHECK_CLUSTERS": "0",
    "STITCHFLEET_SETUP_SHARE": "0",  # a plain session's loop sets up at its first training run, not after 105 s
}


# The program as its own script (sys.argv[0]: the job's name), with the plugin's INFO lines on stderr.
WRAPPER = (
    "import logging, runpy, sys\n"
    "handler = logging.StreamHandler()\n"
    "plugin = logging.getLogger('stitchfleet.plugin')\n"
    "plugin.setLevel(logging.INFO)\n"
    "plugin.addHandler(handler)\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@dataclass
class Outcome:
    finished: bool
    losses: list[float]
    log: str
    installed: int  # clusters the hook installed (its setup line), 0 without one


@dataclass
class Telemetry:
    installed: int = 0
    refused: list[str] = field(default_factory=list)  # compile_failure reasons (translation checks included)
    reverted: list[str] = field(default_factory=list)
    iterations: int = 0
    not_attached: list[str] = field(default_factory=list)


def program_path(program: str) -> Path:
    """Where the corpus holds `program`; a clear error when the corpus directory is not given."""
    if PROGRAMS is None:
        raise FileNotFoundError(f"{CORPUS_DIR} is not set: other people's programs are outside the checkout")
    return PROGRAMS / program


def run(program: str, steps: int, scratch: Path, enabled: bool) -> Outcome:
    """The program in a fresh interpreter with the boot shim on PYTHONPATH (the webhook's injection)."""
    path = program_path(program)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_")}
    env.update(
        PYTHONPATH=f"{ROOT / 'stitchfleet' / 'boot'}{os.pathsep}{ROOT}",
        STITCHFLEET_ENABLED="1" if enabled else "0",
        STITCHFLEET_STATE_DIR=str(scratch / "state"),
        STITCHFLEET_CACHE_DIR=str(kernel_cache()),
        STITCHFLEET_JOB_UID=f"corpus-{program}-{enabled}",
        CORPUS_STEPS=str(steps),
        CORPUS_DIR=str(scratch / "checkpoints"),
        TF_CPP_MIN_LOG_LEVEL="3",
        **(SHIM if enabled else {}),
    )
    scratch.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(path)],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    losses = [float(value) for _, value in LOSS.findall(done.stdout)]
    stitched = STITCHED.search(done.stderr)
    installed = int(stitched.group(1)) if stitched else 0
    return Outcome(done.returncode == 0, losses, done.stdout[-4000:] + done.stderr[-4000:], installed)


def telemetry(scratch: Path, outcome: Outcome) -> Telemetry:
    found = Telemetry(installed=outcome.installed)
    path = scratch / "state" / "telemetry.db"
    # a job that ran as written without setting up spooled its rows (`Ledger.spool_meanwhile`): loaded first
    spool_ingest.claim(scratch / "state" / "spool", f"sqlite:///{path}")
    if not path.exists():
        return found
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            events = connection.execute(sa.select(tables.Event.kind, tables.Event.detail)).all()
            iterations = connection.execute(sa.select(sa.func.sum(tables.StepWindow.iterations))).scalar()
    finally:
        engine.dispose()
    for kind, detail in events:
        {"compile_failure": found.refused, "revert": found.reverted, "not_attached": found.not_attached}.get(
            kind, []
        ).append(detail.splitlines()[0] if detail else "")
    found.iterations = int(iterations or 0)
    return found


def worst_difference(plain: list[float], shimmed: list[float]) -> float:
    """The largest relative difference between the two runs' per-step losses."""
    return max((abs(a - b) / max(abs(a), 1e-30) for a, b in zip(plain, shimmed, strict=True)), default=0.0)
