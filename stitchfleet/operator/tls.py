"""The webhook's TLS material when cert-manager does not provide it.

Input: the webhook Service's name and namespace (and the TLS dir). Output: a
self-signed CA and a serving certificate for the Service's DNS names, PEM files in
the TLS dir (tls.crt, tls.key, ca.crt, the layout of a cert-manager Secret; material
already there that still serves the names is kept, see `ensure_self_signed`), and the
JSONPatch that puts the CA into the caBundle of the MutatingWebhookConfiguration.
`patch_ca_bundle` applies that patch through the kubernetes client (imported lazily).
"""

from __future__ import annotations

import base64
import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"
# Kept across operator restarts while it serves the names; a long life means no silent expiry.
VALID_DAYS = 3650
# Material with less than this left is replaced at start.
KEEP_MARGIN = datetime.timedelta(days=365)
PUBLIC = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
# Tolerate API server clocks slightly behind ours.
BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes: the CA certificate, the serving certificate and its private key."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use for the Service: the .svc one first."""
    if not service or not namespace:
        raise ValueError(f"service and namespace must be non-empty, got {service!r} and {namespace!r}")
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}"]


def make_self_signed(dns_names: list[str], *, now: datetime.datetime | None = None) -> TlsMaterial:
    """A fresh CA and a serving certificate signed by it for `dns_names` (EC P-256 keys)."""
    if not dns_names:
        raise ValueError("a serving certificate needs at least one DNS name")
    start = (now or datetime.datetime.now(datetime.UTC)) - BACKDATE
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key, start)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _serving_certificate(key, dns_names, ca_cert, ca_key, start)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return TlsMaterial(_pem(ca_cert), _pem(cert), key_pem)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(
    subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, start: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _ca_certificate(key: ec.EllipticCurvePrivateKey, start: datetime.datetime) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stitchfleet webhook CA")])
    usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
    builder = (
        _builder("stitchfleet webhook CA", name, key.public_key(), start)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
    )
    return builder.sign(key, hashes.SHA256())


def _serving_certificate(
    key: ec.EllipticCurvePrivateKey,
    dns_names: list[str],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    start: datetime.datetime,
) -> x509.Certificate:
    usage = x509.KeyUsage(True, False, False, False, False, False, False, False, False)
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    builder = (
        _builder(dns_names[0], ca_cert.subject, key.public_key(), start)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        .add_extension(authority, critical=False)
    )
    return builder.sign(ca_key, hashes.SHA256())


def write_tls_dir(directory: Path, material: TlsMaterial) -> None:
    """Writes ca.crt, tls.key, tls.crt, each atomically; the key is private to the owner.

    tls.crt goes last: a server that reloads on its change then finds a matching key.
    """
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(directory / CA_FILE, material.ca_pem, 0o644)
    _write_atomic(directory / KEY_FILE, material.key_pem, 0o600)
    _write_atomic(directory / CERT_FILE, material.cert_pem, 0o644)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    temporary.chmod(mode)
    temporary.replace(path)


def ensure_self_signed(directory: Path, service: str, namespace: str) -> TlsMaterial:
    """The material for the Service in `directory`: kept when still good, else fresh and written.

    Kept across a restart of the operator's container (the dir outlives it): the injected pods
    trust this CA for the ingestion endpoint, and a new CA would cut them off until they end.
    """
    names = service_dns_names(service, namespace)
    kept = reusable(directory, names)
    if kept is not None:
        return kept
    material = make_self_signed(names)
    write_tls_dir(directory, material)
    return material


def reusable(directory: Path, dns_names: list[str], *, now: datetime.datetime | None = None) -> TlsMaterial | None:
    """The material in `directory` when it serves `dns_names`, matches its key and has a year left."""
    try:
        material = TlsMaterial(*(directory.joinpath(name).read_bytes() for name in (CA_FILE, CERT_FILE, KEY_FILE)))
        cert = x509.load_pem_x509_certificate(material.cert_pem)
        ca = x509.load_pem_x509_certificate(material.ca_pem)
        key = serialization.load_pem_private_key(material.key_pem, password=None)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
        cert.verify_directly_issued_by(ca)
    except (OSError, ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return None
    left = cert.not_valid_after_utc - (now or datetime.datetime.now(datetime.UTC))
    same_key = key.public_key().public_bytes(*PUBLIC) == cert.public_key().public_bytes(*PUBLIC)
    return material if names == dns_names and same_key and left > KEEP_MARGIN else None


def ca_bundle_patch(webhook_config: Mapping[str, Any], ca_pem: bytes) -> list[dict[str, Any]]:
    """JSONPatch setting caBundle on every webhook of a MutatingWebhookConfiguration (as a dict).

    Paths use list indices, so `test` operations pin the resourceVersion and each
    webhook's name: a concurrent change makes the API server refuse the patch.
    """
    webhooks = webhook_config.get("webhooks")
    if not isinstance(webhooks, list) or not webhooks:
        name = webhook_config.get("metadata", {}).get("name")
        raise ValueError(f"MutatingWebhookConfiguration {name!r} has no webhooks to patch")
    bundle = base64.b64encode(ca_pem).decode("ascii")
    ops: list[dict[str, Any]] = []
    version = webhook_config.get("metadata", {}).get("resourceVersion")
    if version:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": version})
    for index, webhook in enumerate(webhooks):
        if not isinstance(webhook, dict) or not isinstance(webhook.get("clientConfig"), dict):
            raise ValueError(f"webhook #{index} of the MutatingWebhookConfiguration has no clientConfig")
        ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")})
        ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle})
    return ops


def patch_ca_bundle(config_name: str, ca_pem: bytes, api_client: Any = None, *, timeout: float = 10.0) -> None:
    """Puts `ca_pem` into the caBundle of MutatingWebhookConfiguration `config_name`.

    `api_client` is a kubernetes.client.ApiClient; default: in-cluster config, else ~/.kube/config.
    Each of the two API calls gives up after `timeout` seconds.
    """
    from kubernetes import client, config

    if api_client is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        api_client = client.ApiClient()
    api = client.AdmissionregistrationV1Api(api_client)
    stored = api.read_mutating_webhook_configuration(config_name, _request_timeout=timeout)
    current = api_client.sanitize_for_serialization(stored)
    api.patch_mutating_webhook_configuration(config_name, ca_bundle_patch(current, ca_pem), _request_timeout=timeout)
