"""The bundled PostgreSQL's generated password: a Secret created once, by the operator pod's init container.

Input: a kubernetes ApiClient, the release namespace and the Secret's name. Output: the Secret (key
`password`, 32 letters and digits) created when absent; an existing one is kept, never read nor rewritten.
The chart renders no password, so `helm template` and GitOps render the same manifests every time.
"""

from __future__ import annotations

import base64
import secrets
import string
from typing import Any

KEY = "password"
LENGTH = 32
HTTP_CONFLICT = 409
# Letters and digits only: the operator's URL takes the password as it is ($(PGPASSWORD), no escaping).
ALPHABET = string.ascii_letters + string.digits
LABELS = {"app.kubernetes.io/managed-by": "stitchfleet", "stitchfleet.io/role": "database-password"}


def new_password() -> str:
    """A fresh password: LENGTH characters of ALPHABET from the system's CSPRNG."""
    return "".join(secrets.choice(ALPHABET) for _ in range(LENGTH))


def ensure(api_client: Any, namespace: str, name: str, *, timeout: float) -> bool:
    """Creates Secret `name` with a fresh password unless it exists; True when it was created now."""
    from kubernetes import client

    if not namespace or not name:
        raise ValueError(f"the password Secret needs a namespace and a name, got {namespace!r} and {name!r}")
    encoded = base64.b64encode(new_password().encode()).decode("ascii")
    body = client.V1Secret(metadata=client.V1ObjectMeta(name=name, labels=LABELS), type="Opaque", data={KEY: encoded})
    try:
        client.CoreV1Api(api_client).create_namespaced_secret(namespace, body, _request_timeout=timeout)
    except client.ApiException as err:
        if err.status == HTTP_CONFLICT:
            return False  # made by an earlier start (or by hand): PostgreSQL's data already uses it
        raise
    return True
