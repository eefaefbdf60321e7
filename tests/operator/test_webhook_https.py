"""The webhook contract over real HTTPS on loopback: AdmissionReview in, JSONPatch out.

The server runs on an ephemeral port with a freshly generated CA and serving cert;
the client verifies the certificate against that CA for the Service's DNS name,
as the API server does.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import logging
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from webhook_pods import CONFIG, apply_patch, assert_valid_pod, env_of, make_pod

from stitchfleet import settings
from stitchfleet.operator import admission
from stitchfleet.operator.injection import SHIM_PATH, Mutation
from stitchfleet.operator.tls import (
    CA_FILE,
    ensure_self_signed,
    make_self_signed,
    service_dns_names,
    write_tls_dir,
)
from stitchfleet.operator.webhook_server import WebhookServer

SERVICE, NAMESPACE = "stitchfleet", "stitchfleet-system"
HOSTNAME = f"{SERVICE}.{NAMESPACE}.svc"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tls"
    ensure_self_signed(directory, SERVICE, NAMESPACE)
    return directory


@pytest.fixture
def server(tls_dir: Path) -> Iterator[WebhookServer]:
    with WebhookServer(CONFIG, tls_dir, host="127.0.0.1", port=0) as running:
        yield running


def exchange(port: int, ca_file: Path, raw_request: bytes) -> tuple[int, bytes]:
    """Sends raw HTTP over TLS, verifying the server as HOSTNAME against `ca_file`."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=HOSTNAME) as tls,
    ):
        tls.sendall(raw_request)
        response = http.client.HTTPResponse(tls)
        response.begin()
        return response.status, response.read()


def post(port: int, ca_file: Path, body: bytes, path: str = "/mutate?timeout=5s") -> tuple[int, bytes]:
    head = f"POST {path} HTTP/1.1\r\nHost: {HOSTNAME}\r\nContent-Type: application/json\r\n"
    return exchange(port, ca_file, f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)


def review_of(pod: Any, *, uid: str = "7d4f-uid", kind: str = "Pod", operation: str = "CREATE") -> bytes:
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ml",
        "operation": operation,
        "object": pod,
        "dryRun": False,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def admit(server: WebhookServer, tls_dir: Path, pod: Any, **fields: str) -> dict[str, Any]:
    status, body = post(server.port, tls_dir / CA_FILE, review_of(pod, **fields))
    assert status == 200, body
    answer = json.loads(body)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["allowed"] is True
    return dict(answer["response"])


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return list(json.loads(base64.b64decode(response["patch"])))


def test_opted_in_pod_is_patched_and_a_second_pass_changes_nothing(server: WebhookServer, tls_dir: Path) -> None:
    pod = make_pod()
    first = admit(server, tls_dir, pod, uid="first-uid")
    assert first["uid"] == "first-uid"
    assert "warnings" not in first
    result = apply_patch(pod, patch_of(first))
    assert_valid_pod(result)
    env = env_of(result["spec"]["containers"][0])
    assert env["STITCHFLEET_ENABLED"] == "1"
    assert env["STITCHFLEET_JOB_NAME"] == "resnet-train"
    assert env["PYTHONPATH"] == SHIM_PATH
    second = admit(server, tls_dir, result, uid="second-uid")
    assert second["uid"] == "second-uid"
    assert patch_of(second) == []
    assert "patchType" not in second


def test_opted_out_pod_is_allowed_unchanged(server: WebhookServer, tls_dir: Path) -> None:
    response = admit(server, tls_dir, make_pod(labels={"stitchfleet.io/enabled": "false"}))
    assert patch_of(response) == []
    assert "warnings" not in response


def test_user_set_env_survives_the_round_trip(server: WebhookServer, tls_dir: Path) -> None:
    containers = [
        {
            "name": "trainer",
            "image": "tf",
            "env": [{"name": "STITCHFLEET_TEAM", "value": "mine"}, {"name": "PYTHONPATH", "value": "/src"}],
        }
    ]
    pod = make_pod(labels={"stitchfleet.io/team": "label-team"}, containers=containers)
    result = apply_patch(pod, patch_of(admit(server, tls_dir, pod)))
    assert_valid_pod(result)
    env = env_of(result["spec"]["containers"][0])
    assert env["STITCHFLEET_TEAM"] == "mine"
    assert env["PYTHONPATH"] == f"{SHIM_PATH}:/src"


@pytest.mark.parametrize("pod", [{"metadata": {"labels": {"stitchfleet.io/enabled": "true"}}}, "not-a-pod", None])
def test_malformed_pod_is_allowed_unchanged_with_a_warning(server: WebhookServer, tls_dir: Path, pod: Any) -> None:
    response = admit(server, tls_dir, pod)
    assert patch_of(response) == []
    assert len(response["warnings"]) == 1
    assert response["warnings"][0].startswith("stitchfleet: pod left unchanged")


def test_other_kinds_and_operations_are_allowed_unchanged(server: WebhookServer, tls_dir: Path) -> None:
    not_a_pod = admit(server, tls_dir, {"metadata": {}}, kind="Service")
    assert patch_of(not_a_pod) == []
    assert "only mutates Pods" in not_a_pod["warnings"][0]
    update = admit(server, tls_dir, make_pod(), operation="UPDATE")
    assert patch_of(update) == []


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "body is not JSON"),
        (b"[1, 2]", "body is a JSON list"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "expected apiVersion 'admission.k8s.io/v1'"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "no request"),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}).encode(),
            "request has no uid",
        ),
    ],
)
def test_a_body_that_is_no_admission_review_is_a_400(
    server: WebhookServer, tls_dir: Path, body: bytes, words: str
) -> None:
    status, text = post(server.port, tls_dir / CA_FILE, body)
    assert status == 400
    assert words in text.decode()


def test_wrong_path_method_and_missing_body_are_refused(server: WebhookServer, tls_dir: Path) -> None:
    ca = tls_dir / CA_FILE
    status, text = post(server.port, ca, review_of(make_pod()), path="/validate")
    assert (status, "no such path") == (404, text.decode()[: len("no such path")])
    status, _ = exchange(server.port, ca, f"GET /mutate HTTP/1.1\r\nHost: {HOSTNAME}\r\n\r\n".encode())
    assert status == 405
    # HTTP/1.1 without Content-Length or chunking has an empty body: no review.
    status, text = exchange(server.port, ca, f"POST /mutate HTTP/1.1\r\nHost: {HOSTNAME}\r\n\r\n".encode())
    assert status == 400
    assert "not JSON" in text.decode()


def test_client_with_another_ca_is_refused_and_the_server_keeps_serving(
    server: WebhookServer, tls_dir: Path, tmp_path: Path
) -> None:
    other = ensure_self_signed(tmp_path / "other", SERVICE, NAMESPACE)
    assert other.ca_pem != (tls_dir / CA_FILE).read_bytes()
    with pytest.raises(ssl.SSLCertVerificationError):
        post(server.port, tmp_path / "other" / CA_FILE, review_of(make_pod()))
    assert patch_of(admit(server, tls_dir, make_pod()))


def test_rotated_certificate_is_picked_up_without_a_restart(
    server: WebhookServer, tls_dir: Path, tmp_path: Path
) -> None:
    old_ca = tmp_path / "old-ca.crt"
    shutil.copyfile(tls_dir / CA_FILE, old_ca)
    rotate(tls_dir)
    assert server.reload_certificates() is True
    assert server.reload_certificates() is False
    with pytest.raises(ssl.SSLCertVerificationError):
        post(server.port, old_ca, review_of(make_pod()))
    assert patch_of(admit(server, tls_dir, make_pod()))


def rotate(tls_dir: Path) -> None:
    """New material in place, as cert-manager rotates it (ensure_self_signed would keep the old)."""
    write_tls_dir(tls_dir, make_self_signed(service_dns_names(SERVICE, NAMESPACE)))


def test_rotation_is_noticed_on_the_next_connection(server: WebhookServer, tls_dir: Path) -> None:
    rotate(tls_dir)
    assert patch_of(admit(server, tls_dir, make_pod()))


def test_missing_certificate_fails_at_start_naming_the_file(tmp_path: Path) -> None:
    webhook = WebhookServer(CONFIG, tmp_path / "empty", host="127.0.0.1", port=0)
    with pytest.raises(FileNotFoundError, match=r"tls\.crt"):
        webhook.start()
    with pytest.raises(RuntimeError, match="not started"):
        _ = webhook.port


def test_server_from_settings_serves_on_the_configured_port_and_dir(tls_dir: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    current = settings.load(
        {
            "STITCHFLEET_WEBHOOK_PORT": str(free_port),
            "STITCHFLEET_WEBHOOK_TLS_DIR": str(tls_dir),
            "STITCHFLEET_CLUSTER": "from-settings",
        }
    )
    with WebhookServer.from_settings(current, host="127.0.0.1") as webhook:
        assert webhook.port == free_port
        result = apply_patch(make_pod(), patch_of(admit(webhook, tls_dir, make_pod())))
    assert env_of(result["spec"]["containers"][0])["STITCHFLEET_CLUSTER"] == "from-settings"


def test_stop_releases_the_port(tls_dir: Path) -> None:
    webhook = WebhookServer(CONFIG, tls_dir, host="127.0.0.1", port=0)
    webhook.start()
    port = webhook.port
    webhook.stop()
    webhook.stop()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_a_bug_in_the_mutation_allows_the_pod_unchanged_and_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(pod: Any, config: Any) -> Mutation:
        raise KeyError("boom")

    # Fault injection: no real input makes the mutation raise, the safety net must still hold.
    monkeypatch.setattr(admission, "mutate", broken)
    with caplog.at_level(logging.ERROR, logger="stitchfleet.operator.webhook"):
        answer = admission.review(review_of(make_pod()), CONFIG)
    response = answer["response"]
    assert response == {
        "uid": "7d4f-uid",
        "allowed": True,
        "warnings": ["stitchfleet: internal error in the webhook; pod left unchanged"],
    }
    assert "mutating ml/resnet-train-* failed" in caplog.text
    assert "KeyError" in caplog.text


def test_a_renewed_ca_reaches_the_pods_admitted_after_it_without_a_restart(tls_dir: Path) -> None:
    config = dataclasses.replace(CONFIG, ingest_ca=(tls_dir / CA_FILE).read_text())
    with WebhookServer(config, tls_dir, host="127.0.0.1", port=0) as server:
        before = env_of(apply_patch(make_pod(), patch_of(admit(server, tls_dir, make_pod())))["spec"]["containers"][0])
        assert before["STITCHFLEET_INGEST_CA"] == config.ingest_ca
        rotate(tls_dir)  # cert-manager renewed the certificate and its CA
        after = env_of(apply_patch(make_pod(), patch_of(admit(server, tls_dir, make_pod())))["spec"]["containers"][0])
        assert after["STITCHFLEET_INGEST_CA"] == (tls_dir / CA_FILE).read_text() != config.ingest_ca
