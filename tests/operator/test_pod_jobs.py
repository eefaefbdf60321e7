"""pod_jobs: the pod -> job answer is cached, but not past its TTL: a deleted pod stops writing."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from stitchfleet.operator.pod_jobs import PodJob, PodJobs
from stitchfleet.operator.token_review import PodCaller, Unauthenticated

CALLER = PodCaller("vision", "train-0", "pod-uid-1", "default")


def test_a_deleted_pods_job_is_forgotten_after_the_ttl() -> None:
    pods: dict[tuple[str, str], Mapping[str, Any]] = {
        ("vision", "train-0"): {"metadata": {"name": "train-0", "uid": "pod-uid-1", "labels": {"job-name": "train"}}}
    }
    reads: list[tuple[str, str]] = []

    def fetch(namespace: str, name: str) -> Mapping[str, Any] | None:
        reads.append((namespace, name))
        return pods.get((namespace, name))

    jobs = PodJobs(fetch, ttl=0.2)
    assert jobs.job_of(CALLER) == PodJob("vision", "train-0", "train", "pod-uid-1")
    del pods["vision", "train-0"]
    assert jobs.job_of(CALLER).job_uid == "pod-uid-1" and len(reads) == 1  # cached within the TTL
    time.sleep(0.3)
    with pytest.raises(Unauthenticated, match="does not exist"):  # before: cached for good
        jobs.job_of(CALLER)
    assert len(reads) == 2
