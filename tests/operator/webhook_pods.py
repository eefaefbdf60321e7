"""Shared pieces of the webhook tests: pods as the API server sends them, and checks on patched pods.

A plain module (imported by the tests next to it), not a conftest: the tests call these directly.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from stitchfleet.operator.injection import InjectionConfig

K8S_VERSION = "1.29"

Pod = dict[str, Any]


CONFIG = InjectionConfig(
    cluster="gpu-east",
    shim_image="registry.example/stitchfleet:0.1.0",
    ingest_url="https://stitchfleet.stitchfleet.svc/ingest/v1",
    ingest_ca="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
)


def make_pod(*, labels: dict[str, str] | None = None, containers: list[dict[str, Any]] | None = None) -> Pod:
    """An opted-in training pod as a Job controller creates it (generateName, owner reference)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "resnet-train-",
            "namespace": "ml",
            "labels": {"stitchfleet.io/enabled": "true", **(labels or {})},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "resnet-train", "uid": "u-1", "controller": True}
            ],
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": containers
            if containers is not None
            else [
                {
                    "name": "trainer",
                    "image": "tensorflow/tensorflow:2.15.0-gpu",
                    "command": ["python", "train.py"],
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }
            ],
        },
    }


def apply_patch(pod: Pod, patch: list[dict[str, Any]]) -> Pod:
    """The pod after an RFC 6902 patch (jsonpatch, an independent implementation); `pod` is untouched."""
    return jsonpatch.apply_patch(copy.deepcopy(pod), patch)  # type: ignore[no-any-return]


def assert_valid_pod(pod: Pod) -> None:
    """Schema-valid (strict, k8s 1.29) plus the cross-references the schema cannot express."""
    try:
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f"patched pod is not a valid Pod: {str(err).splitlines()[0]}")
    spec = pod["spec"]
    volumes = [volume["name"] for volume in spec.get("volumes", [])]
    assert len(volumes) == len(set(volumes)), f"duplicate volume names: {volumes}"
    everything = spec.get("initContainers", []) + spec["containers"]
    names = [container["name"] for container in everything]
    assert len(names) == len(set(names)), f"duplicate container names: {names}"
    for container in everything:
        env_names = [var["name"] for var in container.get("env", [])]
        assert len(env_names) == len(set(env_names)), f"{container['name']}: duplicate env names {env_names}"
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{container['name']} mounts unknown volume {mount['name']}"


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value (a literal) or the valueFrom object."""
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container.get("env", [])}
