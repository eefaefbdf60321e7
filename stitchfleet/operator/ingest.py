"""The ingestion endpoint: pods hand their telemetry rows to the operator, the only writer to the database.

Input: HTTPS requests the webhook server routes here (method, path, headers, body):
- POST {BASE}/rows, body {"rows": [row as rows.to_json, ...]}: answered 200 {"stored": n} only
  after the batch is committed (a lost answer makes the pod resend; the upserts on natural keys
  make that harmless);
- GET {BASE}/quarantine: 200 {"reverted": [fingerprint, ...], "slower": [{"fingerprint", "profile",
  "shapes", "jobs", "expires"}, ...], "faster": [same, with "outcome": "faster"]}, the fleet memory as the
  caller's job may read it: fingerprints quarantined for a numeric mismatch (fleet-wide, its namespace's,
  its own job's: telemetry/fleet_quarantine.py) and the live slower and faster verdicts
  (telemetry.slow_verdicts; `slower_jobs` jobs' evidence of several namespaces, or of its own namespace;
  `slower_ttl`). A pod that knows only "reverted" (or "slower") reads what it knows.
Each request carries `Authorization: Bearer <projected ServiceAccount token>`. Output: the answer.

Who may write what: the TokenReview names the pod, the API server's copy of the pod names its job
(pod_jobs.py). Every job row of a batch must be that job's: a row naming another namespace or
job uid refuses the whole batch (403) and nothing is written. The cluster, the job's name and the
pod name are set from the operator's view, never from the body. A pod's cluster verdict is stored as
its job's evidence (a JobVerdict): fleet-wide only once corroborated or confirmed
(telemetry/fleet_quarantine.py), so a pod can neither forge the fleet's memory nor undo it.
Statuses: 400 malformed (naming the row and field), 401 token refused, 403 another job's rows, 413
too many rows, 429 (Retry-After) too many refused tokens from the caller's address, 503 (Retry-
After) when the API server or the database does not answer; no answer names the database, its user
or host. The server (webhook_server.py) bounds what a request may cost before this runs: see
docs/operator-limits.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from stitchfleet.operator.failure_budget import FailureBudget
from stitchfleet.operator.pod_jobs import PodJob, PodJobs
from stitchfleet.operator.token_review import ReviewUnavailable, TokenReviewer, Unauthenticated
from stitchfleet.telemetry.batch_writer import BatchWriter
from stitchfleet.telemetry.database import DatabaseError, RowsRejectedError
from stitchfleet.telemetry.job_metrics import JobMetrics
from stitchfleet.telemetry.kinds import EventKind
from stitchfleet.telemetry.rows import ClusterVerdict, Event, JobKey, JobStarted, JobVerdict, Row, from_json

BASE = "/ingest/v1"
ROWS = f"{BASE}/rows"
QUARANTINE = f"{BASE}/quarantine"
MAX_ROWS = 5000
RETRY_AFTER_SECONDS = 5
# A job's refused batches make one Event per status a minute, however many the pod sends.
REFUSAL_EVENT_SECONDS = 60.0
MAX_REFUSAL_KEYS = 4096

log = logging.getLogger("stitchfleet.operator.ingest")
T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status and JSON object."""

    status: int
    body: Mapping[str, Any]
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Refused(Exception):  # noqa: N818 (an answer, carried out of the helpers)
    """Ends a request with `status` and a reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class IngestService:
    """Answers the endpoint's requests; one per operator process. The server calls `authenticate`
    before it reads any body, then `store` or `memory` with the caller's job."""

    def __init__(
        self,
        cluster: str,
        reviewer: TokenReviewer,
        jobs: PodJobs,
        writer: BatchWriter,
        metrics: JobMetrics,
        *,
        slower_jobs: int = 2,
        slower_ttl: dt.timedelta = dt.timedelta(days=7),
        budget: FailureBudget | None = None,
    ) -> None:
        self.cluster = cluster
        self.reviewer, self.jobs, self.writer, self.metrics = reviewer, jobs, writer, metrics
        self.slower_jobs, self.slower_ttl = slower_jobs, slower_ttl
        self.budget = budget or FailureBudget()
        self._refusals: dict[tuple[str, str, int], float] = {}
        self._refusals_lock = threading.Lock()

    def handles(self, path: str) -> bool:
        """Whether `path` (query string included) is one of the endpoint's."""
        return path.split("?", 1)[0].startswith(BASE + "/")

    def route(self, method: str, path: str) -> str:
        """The route of a request (ROWS or QUARANTINE); Refused(404/405) for any other."""
        route = path.split("?", 1)[0]
        if (method, route) in (("POST", ROWS), ("GET", QUARANTINE)):
            return route
        raise Refused(404, f"no {method} {route}; the endpoint serves POST {ROWS} and GET {QUARANTINE}")

    def authenticate(self, authorization: str, address: str) -> PodJob:
        """The job the caller's token speaks for; Refused(401, 429 or 503) otherwise. Blocking (a
        TokenReview, a pod read): the server runs it in a worker thread, before reading the body."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Refused(401, "a bearer token (the pod's projected ServiceAccount token) is required")
        if not self.reviewer.known(token) and not self.budget.allows(address):
            raise Refused(429, "too many refused tokens from this address; retry later")
        try:
            return self.jobs.job_of(self.reviewer.verify(token))
        except Unauthenticated as err:
            self.budget.refused(address)
            raise Refused(401, str(err)) from None
        except ReviewUnavailable as err:
            log.warning("ingest authentication deferred: %s", err)
            raise Refused(503, "the API server did not answer the TokenReview; retry later") from None

    def store(self, job: PodJob, body: bytes) -> Answer:
        """Writes the body's rows for `job` (blocking: the database); 200 once committed. A batch
        refused for good (400, 403, 413) is recorded as an Event of `job` (at most one per job and
        status a minute): the pod dead-letters the rows, the fleet's reports still see it happened."""
        try:
            rows = parse_rows(body)
            owned = [own(row, job, self.cluster) for row in rows]
            stored = self._database(lambda: self.writer.write(owned))
        except Refused as refusal:
            if refusal.status in (400, 403, 413):
                self._record_refusal(job, refusal)
            raise
        self.metrics.stored(owned)
        return Answer(200, {"stored": stored})

    def _record_refusal(self, job: PodJob, refusal: Refused) -> None:
        now = time.monotonic()
        key = (job.namespace, job.job_uid, refusal.status)
        with self._refusals_lock:
            if now - self._refusals.get(key, -REFUSAL_EVENT_SECONDS) < REFUSAL_EVENT_SECONDS:
                return
            self._refusals[key] = now
            if len(self._refusals) > MAX_REFUSAL_KEYS:
                self._refusals.pop(next(iter(self._refusals)))
        key_of_job = _job_key(job, self.cluster, "")
        event = Event(
            job=key_of_job, kind=EventKind.ROWS_REFUSED, reason=f"http_{refusal.status}", detail=str(refusal)[:1000]
        )
        try:
            self.writer.write([event])
        except DatabaseError as err:  # the refusal is answered all the same
            log.warning("ingest: the refusal of %s/%s not recorded: %s", job.namespace, job.pod_name, err)

    def memory(self, job: PodJob) -> Answer:
        """The fleet memory as `job` may read it (blocking: the database)."""
        return Answer(200, self._database(lambda: self._memory(job)))

    def refusal(self, method: str, route: str, refusal: Refused) -> Answer:
        """The answer to a refused request, counted; 503 and 429 carry Retry-After."""
        self.metrics.refused.labels(str(refusal.status)).inc()
        if refusal.status in (429, 503):
            # 429 is an attacker's everyday answer: counted, logged at info like a 401, not a warning each.
            level = logging.WARNING if refusal.status == 503 else logging.INFO
            log.log(level, "ingest %s %s deferred (%d): %s", method, route, refusal.status, refusal)
            return Answer(refusal.status, {"error": str(refusal)}, {"Retry-After": str(RETRY_AFTER_SECONDS)})
        log.info("ingest %s %s refused (%d): %s", method, route, refusal.status, refusal)
        return Answer(refusal.status, {"error": str(refusal)})

    def _memory(self, job: PodJob) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        memory = self.writer.memory_for(
            job.namespace, job.job_uid, now=now, min_jobs=self.slower_jobs, ttl=self.slower_ttl
        )
        return {
            "reverted": sorted(memory.reverted),
            "slower": [verdict.to_json() for verdict in memory.slower],
            "faster": [verdict.to_json() for verdict in memory.faster],
        }

    def _database(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except RowsRejectedError as err:
            # The database's own words name tables and columns; the pod gets the field-free reason.
            log.warning("ingest: the database refused a batch: %s", err)
            raise Refused(400, "a row does not fit the telemetry schema") from None
        except DatabaseError as err:
            log.warning("ingest: database unavailable: %s", err)
            raise Refused(503, "the telemetry database is unavailable; retry later") from None


def parse_rows(body: bytes) -> list[Row]:
    """The rows of a request body; Refused(400 or 413) naming the first problem."""
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise Refused(400, f"body is not JSON: {err}") from None
    except RecursionError:
        raise Refused(400, "body is JSON nested too deeply") from None
    items = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(items, list):
        raise Refused(400, 'expected {"rows": [...]}')
    if len(items) > MAX_ROWS:
        raise Refused(413, f"{len(items)} rows in one batch; at most {MAX_ROWS}")
    rows = []
    for index, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise ValueError(f"{type(item).__name__}, expected an object")
            rows.append(from_json(item))
        except (ValueError, TypeError, KeyError) as err:
            raise Refused(400, f"rows[{index}]: {err}") from None
    return rows


def own(row: Row, job: PodJob, cluster: str) -> Row:
    """`row` as the caller's job wrote it; Refused(403) when it speaks for another job."""
    if isinstance(row, ClusterVerdict):
        # A pod's verdict is its job's evidence, never the fleet's word (fleet_quarantine.py).
        try:
            return JobVerdict.of(row, _job_key(job, cluster, ""))
        except ValueError as err:  # "cleared" is an admin's word
            raise Refused(400, str(err)) from None
    key: JobKey = row.job
    if key.namespace != job.namespace or key.job_uid != job.job_uid:
        where = f"{key.namespace}/{key.job_name} ({key.job_uid})"
        raise Refused(403, f"pod {job.namespace}/{job.pod_name} may not write rows of job {where}")
    authoritative = _job_key(job, cluster, key.job_name)
    if isinstance(row, JobStarted):
        return dataclasses.replace(row, job=authoritative, pod_name=job.pod_name)
    changed: Row = dataclasses.replace(row, job=authoritative)
    return changed


def _job_key(job: PodJob, cluster: str, claimed_name: str) -> JobKey:
    return JobKey(cluster, job.namespace, job.job_name or claimed_name or job.pod_name, job.job_uid)
