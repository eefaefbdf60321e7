"""tls: self-signed CA + serving cert for the Service, the TLS dir, and the caBundle patch."""

from __future__ import annotations

import base64
import copy
import datetime
import stat
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from stitchfleet import settings
from stitchfleet.operator.tls import (
    CA_FILE,
    CERT_FILE,
    KEY_FILE,
    VALID_DAYS,
    ca_bundle_patch,
    ensure_self_signed,
    make_self_signed,
    reusable,
    service_dns_names,
)


def test_service_dns_names_cover_the_contract() -> None:
    names = service_dns_names("sf", "ops")
    assert names[:2] == ["sf.ops.svc", "sf.ops.svc.cluster.local"]
    with pytest.raises(ValueError, match="non-empty"):
        service_dns_names("", "ops")


def test_serving_certificate_is_signed_by_the_ca_for_the_service_names() -> None:
    now = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
    material = make_self_signed(service_dns_names("sf", "ops"), now=now)
    ca = x509.load_pem_x509_certificate(material.ca_pem)
    cert = x509.load_pem_x509_certificate(material.cert_pem)
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == service_dns_names("sf", "ops")
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
    assert cert.not_valid_after_utc - now > datetime.timedelta(days=365)
    key = serialization.load_pem_private_key(material.key_pem, password=None)
    assert key.public_key() == cert.public_key()


def test_each_call_makes_fresh_material() -> None:
    first, second = make_self_signed(["a.b.svc"]), make_self_signed(["a.b.svc"])
    assert first.ca_pem != second.ca_pem
    assert first.key_pem != second.key_pem
    with pytest.raises(ValueError, match="at least one DNS name"):
        make_self_signed([])


def test_tls_dir_has_the_cert_manager_layout_and_a_private_key(tmp_path: Path) -> None:
    material = ensure_self_signed(tmp_path / "tls", "sf", "ops")
    assert (tmp_path / "tls" / CA_FILE).read_bytes() == material.ca_pem
    assert (tmp_path / "tls" / CERT_FILE).read_bytes() == material.cert_pem
    assert (tmp_path / "tls" / KEY_FILE).read_bytes() == material.key_pem
    assert stat.S_IMODE((tmp_path / "tls" / KEY_FILE).stat().st_mode) == 0o600
    assert sorted(path.name for path in (tmp_path / "tls").iterdir()) == [CA_FILE, CERT_FILE, KEY_FILE]


def test_a_restart_keeps_material_that_still_serves_the_service(tmp_path: Path) -> None:
    first = ensure_self_signed(tmp_path / "tls", "sf", "ops")
    assert ensure_self_signed(tmp_path / "tls", "sf", "ops") == first  # the pods' CA stays valid
    renamed = ensure_self_signed(tmp_path / "tls", "sf2", "ops")
    assert renamed.ca_pem != first.ca_pem  # another Service's names: fresh material
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=VALID_DAYS - 100)
    assert reusable(tmp_path / "tls", service_dns_names("sf2", "ops"), now=later) is None  # under a year left
    (tmp_path / "tls" / KEY_FILE).write_bytes(make_self_signed(["x.y.svc"]).key_pem)
    assert reusable(tmp_path / "tls", service_dns_names("sf2", "ops")) is None  # key of another cert
    (tmp_path / "tls" / CERT_FILE).write_text("garbage")
    assert reusable(tmp_path / "tls", service_dns_names("sf2", "ops")) is None


def webhook_config() -> dict[str, Any]:
    client_config = {"service": {"name": "sf", "namespace": "ops", "path": "/mutate", "port": 443}}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "sf", "resourceVersion": "4711"},
        "webhooks": [
            {"name": "pods.stitchfleet.io", "clientConfig": copy.deepcopy(client_config)},
            {"name": "other.stitchfleet.io", "clientConfig": {**client_config, "caBundle": "b2xk"}},
        ],
    }


def test_ca_bundle_patch_sets_every_webhook_and_pins_the_version() -> None:
    config = webhook_config()
    patched = jsonpatch.apply_patch(config, ca_bundle_patch(config, b"-----PEM-----\n"))
    expected = base64.b64encode(b"-----PEM-----\n").decode()
    assert [hook["clientConfig"]["caBundle"] for hook in patched["webhooks"]] == [expected, expected]
    assert patched["webhooks"][0]["clientConfig"]["service"]["path"] == "/mutate"
    stale = webhook_config()
    stale["metadata"]["resourceVersion"] = "4712"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(stale, ca_bundle_patch(config, b"pem"))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"webhooks": []}, "has no webhooks"),
        ({"webhooks": [{"name": "pods.stitchfleet.io"}]}, "webhook #0 of the MutatingWebhookConfiguration"),
    ],
)
def test_ca_bundle_patch_refuses_a_config_without_webhooks(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ca_bundle_patch({**webhook_config(), **change}, b"pem")


def test_operator_and_webhook_settings_have_the_contract_defaults() -> None:
    current = settings.load({})
    assert current.webhook_port == 8443
    assert current.webhook_tls_dir == Path("/etc/stitchfleet/tls")
    assert current.health_port == 8080
    assert (current.ingest_audience, current.ingest_url) == ("stitchfleet", "")
    chart = settings.load(
        {
            "STITCHFLEET_WEBHOOK_SELF_SIGNED": "false",
            "STITCHFLEET_WEBHOOK_CONFIG_NAME": "sf-release",
            "STITCHFLEET_WEBHOOK_SERVICE": "sf-release",
            "STITCHFLEET_OPERATOR_NAMESPACE": "sf-system",
            "STITCHFLEET_WEBHOOK_TLS_DIR": "/tls",
        }
    )
    assert chart.webhook_self_signed is False
    assert (chart.webhook_config_name, chart.webhook_service, chart.operator_namespace) == (
        "sf-release",
        "sf-release",
        "sf-system",
    )
    assert chart.webhook_tls_dir == Path("/tls")
    with pytest.raises(settings.SettingsError, match="STITCHFLEET_WEBHOOK_PORT"):
        settings.load({"STITCHFLEET_WEBHOOK_PORT": "0"})
