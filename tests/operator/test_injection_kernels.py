"""Where an opted-in pod's kernel cache lives: the pod's state emptyDir by default (each pod compiles once,
a container restart keeps it), or a PersistentVolumeClaim the operator names, which every pod of the job
mounts (its second pod and its restarts reuse the first one's kernels). A user's own value wins."""

from __future__ import annotations

import dataclasses
from typing import Any

from webhook_pods import CONFIG, apply_patch, assert_valid_pod, env_of, make_pod

from stitchfleet import settings
from stitchfleet.operator.injection import KERNEL_MOUNT, KERNEL_VOLUME, STATE_MOUNT, InjectionConfig, mutate


def _patched(pod: dict[str, Any], config: InjectionConfig) -> dict[str, Any]:
    result = apply_patch(pod, mutate(pod, config).patch)
    assert_valid_pod(result)
    return result


def test_by_default_the_kernel_cache_is_in_the_pods_state_volume() -> None:
    result = _patched(make_pod(), CONFIG)
    container = result["spec"]["containers"][0]
    assert env_of(container)["STITCHFLEET_CACHE_DIR"] == f"{STATE_MOUNT}/kernels"
    assert KERNEL_VOLUME not in [v["name"] for v in result["spec"]["volumes"]]
    assert KERNEL_MOUNT not in [m["mountPath"] for m in container["volumeMounts"]]


def test_a_kernel_cache_claim_is_mounted_in_every_container_as_the_cache() -> None:
    config = dataclasses.replace(CONFIG, kernel_cache_claim="team-kernels")
    result = _patched(make_pod(), config)
    assert {"name": KERNEL_VOLUME, "persistentVolumeClaim": {"claimName": "team-kernels"}} in result["spec"]["volumes"]
    for container in result["spec"]["containers"]:
        assert env_of(container)["STITCHFLEET_CACHE_DIR"] == KERNEL_MOUNT
        assert {"name": KERNEL_VOLUME, "mountPath": KERNEL_MOUNT} in container["volumeMounts"]


def test_the_users_own_cache_dir_is_kept() -> None:
    pod = make_pod()
    pod["spec"]["containers"][0].setdefault("env", []).append({"name": "STITCHFLEET_CACHE_DIR", "value": "/data/k"})
    result = _patched(pod, CONFIG)
    assert env_of(result["spec"]["containers"][0])["STITCHFLEET_CACHE_DIR"] == "/data/k"


def test_the_operator_reads_the_claim_from_its_settings() -> None:
    current = settings.load({"STITCHFLEET_KERNEL_CACHE_CLAIM": "team-kernels"})
    assert InjectionConfig.from_settings(current).kernel_cache_claim == "team-kernels"
    assert InjectionConfig.from_settings(settings.load({})).kernel_cache_claim == ""
