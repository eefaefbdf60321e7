"""Every Kubernetes API call the operator makes itself gives up after its timeout.

kmock accepts the call and never answers (an API server that hangs): the SavingsReport update,
the caBundle patch and the launcher Job look-up each raise within a bound instead of holding
the rollup loop or a handler thread for as long as the connection lives.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import pytest
import pytest_asyncio
from kubernetes import client
from operator_process import CONFIG_NAME, NAMESPACE, WEBHOOKS, declare_cluster

from stitchfleet.operator import savings, tls
from stitchfleet.operator.owners import api_job_fetcher

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]
TIMEOUT = 0.3
# urllib3 retries an idempotent request 3 times: 4 attempts of TIMEOUT, with room to spare.
BOUND_SECONDS = 10.0


@pytest_asyncio.fixture
async def hung(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Callable[[str], None]]:
    """Makes `get <path>` hang until the test ends; yields the function that does it."""
    declare_cluster(kmock)
    release = asyncio.Event()

    async def never() -> dict[str, Any]:
        await release.wait()
        return {}

    def hang(path: str) -> None:
        kmock[f"get {path}"] << never

    yield hang
    release.set()


def api_client(api: kmock.KubernetesEmulator) -> Any:
    configuration = client.Configuration()
    configuration.host = str(api.url).rstrip("/")
    return client.ApiClient(configuration)


async def gives_up(call: Callable[[], object]) -> None:
    """`call` raises a timeout, well within the bound."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Exception, match="timed out"):
        await asyncio.wait_for(asyncio.to_thread(call), BOUND_SECONDS)
    assert loop.time() - started < BOUND_SECONDS


async def test_a_savings_report_update_gives_up(kmock: kmock.KubernetesEmulator, hung: Callable[[str], None]) -> None:
    hung(f"/apis/stitchfleet.io/v1alpha1/namespaces/{NAMESPACE}/savingsreports/savings-2026-w47")
    status = savings.report_status(savings.FleetSummary(), dt.datetime(2026, 11, 18, tzinfo=dt.UTC))
    api = api_client(kmock)
    await gives_up(lambda: savings.apply_report(api, NAMESPACE, "2026-W47", status, timeout=TIMEOUT))


async def test_the_ca_bundle_patch_gives_up(kmock: kmock.KubernetesEmulator, hung: Callable[[str], None]) -> None:
    hung(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIG_NAME}")
    assert kmock.objects[WEBHOOKS, None, CONFIG_NAME]
    api = api_client(kmock)
    await gives_up(lambda: tls.patch_ca_bundle(CONFIG_NAME, b"ca", api, timeout=TIMEOUT))


async def test_a_launcher_job_look_up_gives_up(kmock: kmock.KubernetesEmulator, hung: Callable[[str], None]) -> None:
    hung("/apis/batch/v1/namespaces/nlp/jobs/bert-mpi-launcher")
    fetch = api_job_fetcher(api_client(kmock), timeout=TIMEOUT)
    await gives_up(lambda: fetch("nlp", "bert-mpi-launcher"))
