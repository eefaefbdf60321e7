"""Loading a spool directory into a telemetry database: `stitchfleet telemetry ingest SPOOL_DIR`.

Input: a directory of spool files (`*.jsonl`, as `spool.Spool` writes them) and a database URL.
Output: every intact row upserted into the database (schema created or migrated first), one
transaction per file, and a summary (files, rows, skipped lines, files still held by a live
writer). The upserts are keyed on the rows' natural keys, so loading the same spool twice changes
nothing; the files are left in place (the caller owns the directory, and a reload is harmless).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine

from stitchfleet.telemetry import database, spool, store
from stitchfleet.telemetry.rows import Row


@dataclass
class IngestSummary:
    """What one load did: files read, rows written, bad lines skipped, files held by a live writer."""

    files: int = 0
    rows: int = 0
    problems: list[str] = field(default_factory=list)
    busy: list[Path] = field(default_factory=list)


def _held_by_writer(path: Path) -> bool:
    # A live Spool holds an exclusive flock on its file; its rows are still being appended, and
    # it ships them itself. A shared probe lock fails exactly while such a writer lives.
    with path.open("r", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def spool_files(directory: Path) -> list[Path]:
    """The spool files of `directory`, oldest first (the order they were written in)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"spool directory {directory} does not exist")
    files = list(directory.glob(f"*{spool.SUFFIX}"))
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name))


def load(directory: Path, url: str | None = None) -> IngestSummary:
    """Upserts every intact row of the spool files in `directory` into the database at `url`."""
    files = spool_files(directory)  # a wrong path fails before any database is created
    return _ingest(files, database.resolve_url(url), claim=False)


def claim(directory: Path, url: str) -> IngestSummary:
    """Moves the finished spool files of `directory` (their writers gone) into the database at `url`, each file
    deleted once its rows are committed, as a Recorder replays orphans: what a reader of the local database runs
    first, so a job that spooled its rows without a database client (`Ledger.spool_meanwhile`) is in its report.
    Nothing to load: nothing done (no database is created)."""
    files = spool_files(directory) if directory.is_dir() else []
    return _ingest(files, url, claim=True) if files else IngestSummary()


def _ingest(files: Sequence[Path], url: str, *, claim: bool) -> IngestSummary:
    """The files' rows into the database at `url`, one transaction per file; a file its writer still holds is
    left (busy). `claim`: each file is deleted once its rows are committed (`spool.claimed`), else left in place."""
    database.upgrade(url)
    summary = IngestSummary()
    engine = database.connect(url)
    try:
        ids: store.JobIds = {}
        for path in files:
            with _opened(path, claim) as content:
                if content is None:
                    summary.busy.append(path)
                    continue
                rows = content.rows
                summary.rows += database.retry_locked(lambda: _transaction(engine, rows, ids))  # noqa: B023
                summary.files += 1
                summary.problems.extend(content.problems)
    finally:
        engine.dispose()
    return summary


@contextmanager
def _opened(path: Path, claim: bool) -> Iterator[spool.SpoolRead | None]:
    """The file's rows, or None while its writer holds it; claimed (deleted after the block) or only read."""
    if claim:
        with spool.claimed(path) as content:
            yield content
        return
    yield None if _held_by_writer(path) else spool.read(path)


def _transaction(engine: Engine, rows: Sequence[Row], ids: store.JobIds) -> int:
    """Writes `rows` in one transaction; `ids` learns their job ids only once it commits."""
    attempt = dict(ids)
    with engine.begin() as connection:
        count = store.write_rows(connection, rows, attempt)
    ids.update(attempt)
    return count
