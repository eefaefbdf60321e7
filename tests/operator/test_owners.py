"""owners: an MPIJob's launcher Job is recognised from the watch or by one fetch; its pods are ignored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from operator_bodies import LAUNCHER_JOB_UID, MPIJOB_UID, bare_pod, batch_job, job_pod, launcher_job, mpi_pod

from stitchfleet.operator.owners import OwnerChains, launcher_parent


class Fetcher:
    """Serves batch Jobs by (namespace, name) like the API would, and counts the requests."""

    def __init__(self, *jobs: dict[str, Any]) -> None:
        self.jobs = {(job["metadata"]["namespace"], job["metadata"]["name"]): job for job in jobs}
        self.calls: list[tuple[str, str]] = []

    def __call__(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.calls.append((namespace, name))
        return self.jobs.get((namespace, name))


def test_only_a_job_an_mpijob_controls_is_a_launcher() -> None:
    parent = launcher_parent(launcher_job())
    assert parent is not None and parent["uid"] == MPIJOB_UID
    assert launcher_parent(batch_job()) is None
    not_controller = launcher_job()
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert launcher_parent(not_controller) is None


def test_a_job_learnt_from_the_watch_decides_without_fetching() -> None:
    fetcher = Fetcher()
    chains = OwnerChains(fetcher)
    chains.learn(launcher_job())
    chains.learn(batch_job())
    assert chains.ignores(mpi_pod("launcher"))
    assert not chains.ignores(mpi_pod("worker", 1)), "workers are owned by the MPIJob itself"
    assert not chains.ignores(job_pod(0)) and not chains.ignores(bare_pod())
    assert fetcher.calls == []


def test_a_job_not_seen_yet_is_fetched_once() -> None:
    fetcher = Fetcher(launcher_job(opted_in=False))
    chains = OwnerChains(fetcher)
    assert chains.ignores(mpi_pod("launcher")) and chains.ignores(mpi_pod("launcher"))
    assert fetcher.calls == [("nlp", "bert-mpi-launcher")]


def test_a_pod_whose_job_is_gone_or_recreated_is_ignored() -> None:
    assert OwnerChains(Fetcher()).ignores(mpi_pod("launcher")), "deleted: nothing left to attribute"
    recreated = launcher_job()
    recreated["metadata"]["uid"] = "another-uid"
    assert OwnerChains(Fetcher(recreated)).ignores(mpi_pod("launcher"))


def test_without_the_api_an_unseen_job_is_a_job_of_its_own() -> None:
    chains = OwnerChains()
    assert not chains.ignores(mpi_pod("launcher"))
    chains.learn(launcher_job())
    assert chains.ignores(mpi_pod("launcher"))
    chains.forget(launcher_job())
    assert not chains.ignores(mpi_pod("launcher")), "a deleted Job is forgotten: memory follows the live Jobs"
    assert LAUNCHER_JOB_UID not in repr(vars(chains)["_parents"])
