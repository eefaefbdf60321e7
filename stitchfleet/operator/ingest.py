"""The ingestion endpoint: pods hand their telemetry rows to the operator, the only writer to the database.

Input: HTTPS requests the webhook server routes here (method, path, headers, body):
- POST {BASE}/rows, body {"rows": [row as rows.to_json, ...]}: answered 200 {"stored": n} only
  after the batch is committed (a lost answer makes the pod resend; the upserts on natural keys
  make that harmless);
- GET {BASE}/quarantine: 200 {"reverted": [fingerprint, ...], "slower": [{"fingerprint", "profile",
  "shapes", "jobs", "expires"}, ...]}, the fleet memory: fingerprints quarantined for a numeric
  mismatch, and the live slower verdicts (telemetry.slow_verdicts; `slower_jobs` jobs' evidence,
  `slower_ttl`). A pod that knows only "reverted" reads what it knows.
Each request carries `Authorization: Bearer <projected ServiceAccount token>`. Output: the answer.

Who may write what: the TokenReview names the pod, the API server's copy of the pod names its job
(pod_jobs.py). Every job row of a batch must be that job's: a row naming another namespace or
job uid refuses the whole batch (403) and nothing is written. The cluster, the job's name and the
pod name are set from the operator's view, never from the body. Cluster verdicts are fleet-wide
by design and pass as they are. Statuses: 400 malformed, 401 token refused, 403 another job's
rows, 413 too many rows, 503 (Retry-After) when the API server or the database does not answer.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stitchfleet.operator.pod_jobs import PodJob, PodJobs
from stitchfleet.operator.token_review import ReviewUnavailable, TokenReviewer, Unauthenticated
from stitchfleet.telemetry.batch_writer import BatchWriter
from stitchfleet.telemetry.database import DatabaseError
from stitchfleet.telemetry.job_metrics import JobMetrics
from stitchfleet.telemetry.rows import JobKey, JobStarted, Row, from_json

BASE = "/ingest/v1"
ROWS = f"{BASE}/rows"
QUARANTINE = f"{BASE}/quarantine"
MAX_ROWS = 5000
RETRY_AFTER_SECONDS = 5

log = logging.getLogger("stitchfleet.operator.ingest")


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
    """Answers the endpoint's requests; one per operator process."""

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
    ) -> None:
        self.cluster = cluster
        self.reviewer, self.jobs, self.writer, self.metrics = reviewer, jobs, writer, metrics
        self.slower_jobs, self.slower_ttl = slower_jobs, slower_ttl

    def handles(self, path: str) -> bool:
        """Whether `path` (query string included) is one of the endpoint's."""
        return path.split("?", 1)[0].startswith(BASE + "/")

    def answer(self, method: str, path: str, authorization: str, body: bytes) -> Answer:
        """The answer to one request; never raises."""
        route = path.split("?", 1)[0]
        try:
            if (method, route) == ("POST", ROWS):
                return self._rows(authorization, body)
            if (method, route) == ("GET", QUARANTINE):
                self._caller(authorization)
                return Answer(200, self._database(self._memory))
            raise Refused(404, f"no {method} {route}; the endpoint serves POST {ROWS} and GET {QUARANTINE}")
        except Refused as refusal:
            self.metrics.refused.labels(str(refusal.status)).inc()
            if refusal.status == 503:
                log.warning("ingest %s %s deferred: %s", method, route, refusal)
                return Answer(503, {"error": str(refusal)}, {"Retry-After": str(RETRY_AFTER_SECONDS)})
            log.info("ingest %s %s refused (%d): %s", method, route, refusal.status, refusal)
            return Answer(refusal.status, {"error": str(refusal)})

    def _rows(self, authorization: str, body: bytes) -> Answer:
        job = self._caller(authorization)
        rows = parse_rows(body)
        owned = [own(row, job, self.cluster) for row in rows]
        stored = self._database(lambda: self.writer.write(owned))
        self.metrics.stored(owned)
        return Answer(200, {"stored": stored})

    def _memory(self) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        slower = self.writer.slower(now=now, min_jobs=self.slower_jobs, ttl=self.slower_ttl)
        return {"reverted": sorted(self.writer.reverted()), "slower": [verdict.to_json() for verdict in slower]}

    def _caller(self, authorization: str) -> PodJob:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "a bearer token (the pod's projected ServiceAccount token) is required")
        try:
            return self.jobs.job_of(self.reviewer.verify(token.strip()))
        except Unauthenticated as err:
            raise Refused(401, str(err)) from None
        except ReviewUnavailable as err:
            raise Refused(503, str(err)) from None

    def _database(self, call: Any) -> Any:
        try:
            return call()
        except DatabaseError as err:
            raise Refused(503, str(err)) from None


def parse_rows(body: bytes) -> list[Row]:
    """The rows of a request body; Refused(400 or 413) naming the first problem."""
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise Refused(400, f"body is not JSON: {err}") from None
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
    key: JobKey | None = getattr(row, "job", None)
    if key is None:
        return row  # a cluster verdict: fleet-wide, no job's figure
    if key.namespace != job.namespace or key.job_uid != job.job_uid:
        where = f"{key.namespace}/{key.job_name} ({key.job_uid})"
        raise Refused(403, f"pod {job.namespace}/{job.pod_name} may not write rows of job {where}")
    authoritative = JobKey(cluster, job.namespace, job.job_name or key.job_name, job.job_uid)
    if isinstance(row, JobStarted):
        return dataclasses.replace(row, job=authoritative, pod_name=job.pod_name)
    changed: Row = dataclasses.replace(row, job=authoritative)  # type: ignore[arg-type]  # every job row has .job
    return changed
