"""The self-signed webhook material kept in a Secret: the CA the pods trust survives a replaced operator pod.

Input: a kubernetes ApiClient, the operator's namespace, the webhook Service's name and the TLS dir.
Output: the material in the TLS dir: the Secret's (`<service>-webhook-self-signed`) while it still
serves the Service (tls.reusable), else fresh material stored in the Secret first (created, or
patched) and then written to the dir. Without it the CA lived in the pod's emptyDir: a new operator
pod made a new CA, and every running pod's TLS to the ingestion endpoint failed until it ended.
"""

from __future__ import annotations

import base64
import logging
import tempfile
from pathlib import Path
from typing import Any

from stitchfleet.operator import tls

SUFFIX = "-webhook-self-signed"
HTTP_NOT_FOUND, HTTP_CONFLICT = 404, 409
FILES = (tls.CA_FILE, tls.CERT_FILE, tls.KEY_FILE)

log = logging.getLogger("stitchfleet.operator")


def secret_name(service: str) -> str:
    """The Secret holding the Service's self-signed material."""
    return f"{service}{SUFFIX}"


def ensure(api_client: Any, namespace: str, service: str, directory: Path, *, timeout: float) -> tls.TlsMaterial:
    """The material for `service` in `directory`, from the Secret when it still serves (see the docstring)."""
    from kubernetes import client

    core, name = client.CoreV1Api(api_client), secret_name(service)
    names = tls.service_dns_names(service, namespace)
    stored = _read(core, namespace, name, timeout)
    if stored is not None:
        kept = _usable(stored, names)
        if kept is not None:
            tls.write_tls_dir(directory, kept)
            return kept
    material = tls.make_self_signed(names)
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/managed-by": "stitchfleet"}),
        type="kubernetes.io/tls",
        data={file: base64.b64encode(getattr(material, _field(file))).decode() for file in FILES},
    )
    try:
        if stored is None:
            core.create_namespaced_secret(namespace, body, _request_timeout=timeout)
        else:
            core.patch_namespaced_secret(name, namespace, {"data": body.data}, _request_timeout=timeout)
    except client.ApiException as err:
        if err.status != HTTP_CONFLICT:
            raise
        # Another operator pod stored its material first: use that one, so both serve one CA.
        return ensure(api_client, namespace, service, directory, timeout=timeout)
    log.info("new self-signed webhook material stored in Secret %s/%s", namespace, name)
    tls.write_tls_dir(directory, material)
    return material


def _field(file: str) -> str:
    return {tls.CA_FILE: "ca_pem", tls.CERT_FILE: "cert_pem", tls.KEY_FILE: "key_pem"}[file]


def _read(core: Any, namespace: str, name: str, timeout: float) -> dict[str, bytes] | None:
    from kubernetes import client

    try:
        secret = core.read_namespaced_secret(name, namespace, _request_timeout=timeout)
    except client.ApiException as err:
        if err.status == HTTP_NOT_FOUND:
            return None
        raise
    data = secret.data or {}
    return {file: base64.b64decode(data.get(file) or "") for file in FILES}


def _usable(stored: dict[str, bytes], names: list[str]) -> tls.TlsMaterial | None:
    """The stored material when it serves `names`, matches its key and has a year left (tls.reusable)."""
    with tempfile.TemporaryDirectory() as scratch:
        for file, data in stored.items():
            Path(scratch, file).write_bytes(data)
        return tls.reusable(Path(scratch), names)
