"""AdmissionReview v1 in, AdmissionReview v1 out: the webhook's protocol layer.

Input: the raw body the API server POSTs to /mutate and an `InjectionConfig`.
Output: the response AdmissionReview as a dict: the request's uid, `allowed: true`
always, the JSONPatch base64-encoded with patchType JSONPatch when there is one,
and warnings. A body that is not an AdmissionReview raises `ReviewError` (the
server answers 400: that is a broken API server, not a pod); any failure while
mutating a pod allows it unchanged with a warning, and is logged.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from stitchfleet.operator.injection import InjectionConfig, Mutation, mutate

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
# The API server truncates longer warnings; ours are short, this is a guard.
WARNING_LIMIT = 256

log = logging.getLogger("stitchfleet.operator.webhook")


class ReviewError(ValueError):
    """The request body is not an AdmissionReview v1 with a request and its uid."""


def parse_request(body: bytes) -> dict[str, Any]:
    """The `request` of an AdmissionReview v1 body; ReviewError says what is wrong."""
    try:
        review = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReviewError(f"body is not JSON: {err}") from None
    except RecursionError:
        raise ReviewError("body is JSON nested too deeply") from None
    if not isinstance(review, dict):
        raise ReviewError(f"body is a JSON {type(review).__name__}, expected an AdmissionReview object")
    if (review.get("apiVersion"), review.get("kind")) != (API_VERSION, KIND):
        got = f"{review.get('apiVersion')!r}/{review.get('kind')!r}"
        raise ReviewError(f"expected apiVersion {API_VERSION!r} and kind {KIND!r}, got {got}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("AdmissionReview has no request object")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise ReviewError("AdmissionReview request has no uid")
    return request


def review(body: bytes, config: InjectionConfig, on_patched: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The response AdmissionReview for a request body; `on_patched` gets the namespace of a pod it patches."""
    request = parse_request(body)
    mutation = _mutation(request, config)
    namespace = request.get("namespace")
    if mutation.patch and on_patched is not None and isinstance(namespace, str):
        on_patched(namespace)
    return respond(request["uid"], mutation)


def respond(uid: str, mutation: Mutation) -> dict[str, Any]:
    """An AdmissionReview v1 response that allows the object, with its patch and warnings."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if mutation.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(mutation.patch).encode()).decode("ascii")
    if mutation.warnings:
        response["warnings"] = [text[:WARNING_LIMIT] for text in mutation.warnings]
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _mutation(request: dict[str, Any], config: InjectionConfig) -> Mutation:
    where = _describe(request)
    kind = request.get("kind")
    if not isinstance(kind, dict) or kind.get("kind") != "Pod":
        return Mutation(warnings=[f"stitchfleet: webhook only mutates Pods, left {where} unchanged"])
    if request.get("operation") != "CREATE":
        return Mutation()
    try:
        mutation = mutate(request.get("object"), config)
    except Exception:
        # The webhook must never block a pod, whatever bug hides in the mutation.
        log.exception("mutating %s failed; allowing it unchanged", where)
        return Mutation(warnings=["stitchfleet: internal error in the webhook; pod left unchanged"])
    for warning in mutation.warnings:
        log.warning("%s: %s", where, warning)
    return mutation


def _describe(request: dict[str, Any]) -> str:
    """'namespace/name' of the request's object, for logs and warnings."""
    name = request.get("name") or _generate_name(request.get("object")) or "<unnamed>"
    return f"{request.get('namespace') or '<no namespace>'}/{name}"


def _generate_name(obj: Any) -> str:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    value = metadata.get("generateName") if isinstance(metadata, dict) else None
    return f"{value}*" if isinstance(value, str) else ""
