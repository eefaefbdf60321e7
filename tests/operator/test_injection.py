"""injection: the JSONPatch an opted-in pod gets, applied and validated as a real Pod."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from webhook_pods import CONFIG, apply_patch, assert_valid_pod, env_of, make_pod

from stitchfleet import __version__, settings
from stitchfleet.operator.injection import (
    ANNOTATION_INJECTED,
    CA_MOUNT,
    CA_VOLUME,
    SHIM_MOUNT,
    SHIM_PATH,
    SHIM_VOLUME,
    STATE_MOUNT,
    STATE_VOLUME,
    TOKEN_MOUNT,
    TOKEN_VOLUME,
    InjectionConfig,
    Mutation,
    escape,
    mutate,
    pointer,
)


def patched(pod: dict[str, Any]) -> tuple[dict[str, Any], Mutation]:
    mutation = mutate(pod, CONFIG)
    result = apply_patch(pod, mutation.patch)
    assert_valid_pod(result)
    return result, mutation


def test_opted_in_pod_gets_identity_ingestion_endpoint_token_and_shim() -> None:
    pod = make_pod(labels={"stitchfleet.io/team": "vision", "stitchfleet.io/model": "resnet50"})
    result, mutation = patched(pod)
    assert mutation.warnings == []
    env = env_of(result["spec"]["containers"][0])
    assert env["STITCHFLEET_ENABLED"] == "1"
    assert env["STITCHFLEET_CLUSTER"] == "gpu-east"
    assert env["STITCHFLEET_NAMESPACE"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
    assert env["STITCHFLEET_POD_NAME"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
    assert env["STITCHFLEET_JOB_NAME"] == "resnet-train"
    assert env["STITCHFLEET_TEAM"] == "vision"
    assert env["STITCHFLEET_MODEL"] == "resnet50"
    assert env["STITCHFLEET_GPUS_PER_RANK"] == "2"
    assert "STITCHFLEET_DB_URL" not in env  # the operator is the only writer: no credentials in the pod
    assert env["STITCHFLEET_INGEST_URL"] == CONFIG.ingest_url
    assert env["STITCHFLEET_INGEST_CA"] == CONFIG.ingest_ca
    assert env["STITCHFLEET_INGEST_TOKEN_FILE"] == f"{TOKEN_MOUNT}/token"
    assert env["STITCHFLEET_STATE_DIR"] == STATE_MOUNT
    assert env["PYTHONPATH"] == SHIM_PATH
    assert result["metadata"]["annotations"] == {ANNOTATION_INJECTED: __version__}
    token = {"audience": "stitchfleet", "expirationSeconds": 3600, "path": "token"}
    assert result["spec"]["volumes"] == [
        {"name": SHIM_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}},
        {"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}},
        {"name": STATE_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    init = result["spec"]["initContainers"]
    assert [c["name"] for c in init] == [SHIM_VOLUME]
    assert init[0]["image"] == CONFIG.shim_image
    assert init[0]["command"] == ["stitchfleet", "shim", "install", SHIM_MOUNT]
    # What PodSecurity "restricted" requires of every container, so such namespaces admit the pod.
    restricted = init[0]["securityContext"]
    assert restricted["runAsNonRoot"] is True and restricted["runAsUser"] > 0
    assert restricted["allowPrivilegeEscalation"] is False and restricted["capabilities"] == {"drop": ["ALL"]}
    assert restricted["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = result["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [
        {"name": SHIM_VOLUME, "mountPath": SHIM_MOUNT, "readOnly": True},
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT, "readOnly": True},
        {"name": STATE_VOLUME, "mountPath": STATE_MOUNT},
    ]
    assert pod == make_pod(labels={"stitchfleet.io/team": "vision", "stitchfleet.io/model": "resnet50"})


def test_second_pass_changes_nothing() -> None:
    result, _ = patched(make_pod())
    assert mutate(result, CONFIG) == Mutation()


def test_without_the_annotation_a_second_pass_only_marks_the_pod() -> None:
    result, _ = patched(make_pod())
    del result["metadata"]["annotations"]
    again, mutation = patched(result)
    assert mutation.patch == [
        {"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION_INJECTED: __version__}}
    ]
    assert again["spec"] == result["spec"]


def test_user_set_variables_are_never_overwritten() -> None:
    user_env = [
        {"name": "STITCHFLEET_JOB_NAME", "value": "my-own-name"},
        {"name": "STITCHFLEET_DB_URL", "valueFrom": {"secretKeyRef": {"name": "team-db", "key": "dsn"}}},
        {"name": "STITCHFLEET_ENABLED", "value": "0"},
        {"name": "HOME", "value": "/work"},
    ]
    containers = [{"name": "trainer", "image": "tf:2.15", "env": copy.deepcopy(user_env)}]
    result, _ = patched(make_pod(containers=containers))
    env_list = result["spec"]["containers"][0]["env"]
    assert env_list[: len(user_env)] == user_env
    env = env_of(result["spec"]["containers"][0])
    assert env["STITCHFLEET_JOB_NAME"] == "my-own-name"
    assert env["STITCHFLEET_ENABLED"] == "0"
    assert env["STITCHFLEET_DB_URL"] == {"secretKeyRef": {"name": "team-db", "key": "dsn"}}
    assert env["STITCHFLEET_CLUSTER"] == "gpu-east"
    assert env["STITCHFLEET_GPUS_PER_RANK"] == "0"


@pytest.mark.parametrize(
    ("user_value", "expected"),
    [("/app/lib:/app", f"{SHIM_PATH}:/app/lib:/app"), ("", SHIM_PATH), (f"/x:{SHIM_PATH}", f"/x:{SHIM_PATH}")],
)
def test_user_pythonpath_literal_gets_the_shim_prepended(user_value: str, expected: str) -> None:
    containers = [{"name": "trainer", "image": "tf", "env": [{"name": "PYTHONPATH", "value": user_value}]}]
    result, _ = patched(make_pod(containers=containers))
    assert env_of(result["spec"]["containers"][0])["PYTHONPATH"] == expected
    assert mutate(result, CONFIG) == Mutation()


def test_pythonpath_from_value_from_is_left_alone_with_a_warning() -> None:
    source = {"configMapKeyRef": {"name": "paths", "key": "pythonpath"}}
    containers = [{"name": "trainer", "image": "tf", "env": [{"name": "PYTHONPATH", "valueFrom": source}]}]
    result, mutation = patched(make_pod(containers=containers))
    assert env_of(result["spec"]["containers"][0])["PYTHONPATH"] == source
    assert len(mutation.warnings) == 1
    assert "PYTHONPATH from valueFrom" in mutation.warnings[0]
    assert "spec.containers[0]" in mutation.warnings[0]


def test_env_from_keeps_its_pythonpath_through_expansion() -> None:
    containers = [{"name": "trainer", "image": "tf", "envFrom": [{"configMapRef": {"name": "job-env"}}]}]
    result, _ = patched(make_pod(containers=containers))
    assert env_of(result["spec"]["containers"][0])["PYTHONPATH"] == f"{SHIM_PATH}:$(PYTHONPATH)"


def test_existing_volumes_init_containers_and_mounts_are_kept_in_place() -> None:
    data_mount = {"name": "data", "mountPath": "/data"}
    containers = [
        {
            "name": "trainer",
            "image": "tf",
            "volumeMounts": [data_mount],
            "resources": {"limits": {"nvidia.com/gpu": 8}},
        },
        {"name": "sidecar", "image": "busybox"},
    ]
    pod = make_pod(containers=containers)
    pod["metadata"]["annotations"] = {"team.example/owner": "ana"}
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox", "command": ["true"]}]
    result, _ = patched(pod)
    spec = result["spec"]
    ours = [SHIM_VOLUME, TOKEN_VOLUME, STATE_VOLUME]
    assert [v["name"] for v in spec["volumes"]] == ["data", *ours]
    assert [c["name"] for c in spec["initContainers"]] == ["fetch", SHIM_VOLUME]
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["data", *ours]
    assert [m["name"] for m in spec["containers"][1]["volumeMounts"]] == ours
    assert env_of(spec["containers"][0])["STITCHFLEET_GPUS_PER_RANK"] == "8"
    assert env_of(spec["containers"][1])["STITCHFLEET_GPUS_PER_RANK"] == "0"
    assert result["metadata"]["annotations"] == {"team.example/owner": "ana", ANNOTATION_INJECTED: __version__}


def test_annotation_path_is_escaped_per_rfc6901() -> None:
    pod = make_pod()
    pod["metadata"]["annotations"] = {}
    ops = mutate(pod, CONFIG).patch
    assert {"op": "add", "path": "/metadata/annotations/stitchfleet.io~1injected", "value": __version__} in ops
    assert escape("a~b/c") == "a~0b~1c"
    assert pointer("metadata", "labels", "x/y~z") == "/metadata/labels/x~1y~0z"


def test_foreign_mount_at_the_shim_path_is_kept_with_a_warning() -> None:
    containers = [{"name": "trainer", "image": "tf", "volumeMounts": [{"name": "opt", "mountPath": SHIM_MOUNT}]}]
    pod = make_pod(containers=containers)
    pod["spec"]["volumes"] = [{"name": "opt", "emptyDir": {}}]
    result, mutation = patched(pod)
    mounts = result["spec"]["containers"][0]["volumeMounts"]
    assert [m["name"] for m in mounts] == ["opt", TOKEN_VOLUME, STATE_VOLUME]
    assert any("already mounts a volume" in text and "boot shim not mounted" in text for text in mutation.warnings)


@pytest.mark.parametrize(
    ("labels", "annotations"),
    [
        ({"stitchfleet.io/enabled": "false"}, {}),
        ({"stitchfleet.io/enabled": "FALSE"}, {}),
        ({"stitchfleet.io/enabled": "true"}, {"stitchfleet.io/enabled": "false"}),
        ({}, {}),
        ({"stitchfleet.io/enabled": "yes-please"}, {}),
    ],
)
def test_opted_out_pods_are_left_alone(labels: dict[str, str], annotations: dict[str, str]) -> None:
    pod = make_pod()
    pod["metadata"]["labels"] = labels
    pod["metadata"]["annotations"] = annotations
    assert mutate(pod, CONFIG) == Mutation()


@pytest.mark.parametrize(
    ("extra_labels", "metadata_change", "expected"),
    [
        ({"stitchfleet.io/job": "bert-large", "job-name": "x"}, {}, "bert-large"),
        ({"training.kubeflow.org/job-name": "tfjob-7"}, {}, "tfjob-7"),
        ({"batch.kubernetes.io/job-name": "nightly"}, {}, "nightly"),
        ({}, {}, "resnet-train"),
        ({}, {"ownerReferences": None}, "resnet-train"),
        ({}, {"ownerReferences": None, "generateName": None, "name": "solo"}, "solo"),
    ],
)
def test_job_name_comes_from_labels_then_owner_then_names(
    extra_labels: dict[str, str], metadata_change: dict[str, Any], expected: str
) -> None:
    pod = make_pod(labels=extra_labels)
    for key, value in metadata_change.items():
        if value is None:
            del pod["metadata"][key]
        else:
            pod["metadata"][key] = value
    result, _ = patched(pod)
    assert env_of(result["spec"]["containers"][0])["STITCHFLEET_JOB_NAME"] == expected


def test_controller_owner_wins_over_other_owners() -> None:
    pod = make_pod()
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "incidental", "uid": "u-2"},
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "tfjob-9", "uid": "u-3", "controller": True},
    ]
    result, _ = patched(pod)
    assert env_of(result["spec"]["containers"][0])["STITCHFLEET_JOB_NAME"] == "tfjob-9"


def test_unreadable_gpu_count_is_a_warning_not_a_failure() -> None:
    containers = [{"name": "trainer", "image": "tf", "resources": {"limits": {"nvidia.com/gpu": "lots"}}}]
    result, mutation = patched(make_pod(containers=containers))
    assert "STITCHFLEET_GPUS_PER_RANK" not in env_of(result["spec"]["containers"][0])
    assert any("'lots'" in text for text in mutation.warnings)


def _set(pod: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    target: Any = pod
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return pod


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (("spec",), None, "spec is NoneType"),
        (("spec", "containers"), [], "spec.containers is missing or empty"),
        (("spec", "containers"), "trainer", "spec.containers is str"),
        (("spec", "containers", 0), "trainer", "spec.containers[0] is str"),
        (("spec", "containers", 0, "env"), {"A": "1"}, "spec.containers[0].env is dict"),
        (("spec", "containers", 0, "env"), [{"value": "1"}], "spec.containers[0].env[0].name"),
        (("spec", "containers", 0, "name"), 7, "spec.containers[0].name"),
        (("spec", "containers", 0, "resources"), [], "spec.containers[0].resources is list"),
        (("spec", "volumes"), {"a": 1}, "spec.volumes is dict"),
        (("spec", "initContainers"), [3], "spec.initContainers[0] is int"),
        (("metadata", "labels", "stitchfleet.io/team"), 5, "metadata.labels['stitchfleet.io/team'] is int"),
        (("metadata", "annotations"), ["x"], "metadata.annotations is list"),
        (("metadata", "ownerReferences"), "job", "metadata.ownerReferences is str"),
        (("spec", "containers", 0, "name"), SHIM_VOLUME, "the name of the boot shim's init container"),
    ],
)
def test_malformed_pods_are_left_unchanged_with_a_warning(path: tuple[str | int, ...], value: Any, words: str) -> None:
    mutation = mutate(_set(make_pod(), path, value), CONFIG)
    assert mutation.patch == []
    assert len(mutation.warnings) == 1
    assert mutation.warnings[0].startswith("stitchfleet: pod left unchanged: ")
    assert words in mutation.warnings[0]


@pytest.mark.parametrize("garbage", [None, "pod", 42, [make_pod()]])
def test_non_object_pod_is_left_unchanged(garbage: Any) -> None:
    mutation = mutate(garbage, CONFIG)
    assert mutation.patch == []
    assert "the pod is" in mutation.warnings[0]


def test_config_follows_settings(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("the CA")
    current = settings.load(
        {
            "STITCHFLEET_CLUSTER": "west",
            "STITCHFLEET_SHIM_IMAGE": "reg/sf:9",
            "STITCHFLEET_WEBHOOK_SERVICE": "sf",
            "STITCHFLEET_OPERATOR_NAMESPACE": "ops",
            "STITCHFLEET_WEBHOOK_TLS_DIR": str(tmp_path),
            "STITCHFLEET_INGEST_AUDIENCE": "telemetry",
        }
    )
    expected = InjectionConfig("west", "reg/sf:9", "https://sf.ops.svc/ingest/v1", "the CA", "telemetry")
    assert InjectionConfig.from_settings(current) == expected
    default = InjectionConfig.from_settings(settings.load({}))
    assert default.shim_image == f"stitchfleet:{__version__}"
    assert default.ingest_ca == ""  # no TLS material yet: the pods then trust the system CAs


def test_a_user_who_set_the_state_dir_keeps_it() -> None:
    containers = [{"name": "trainer", "image": "tf", "env": [{"name": "STITCHFLEET_STATE_DIR", "value": "/scratch"}]}]
    result, _ = patched(make_pod(containers=containers))
    assert env_of(result["spec"]["containers"][0])["STITCHFLEET_STATE_DIR"] == "/scratch"


def test_with_a_ca_configmap_the_pod_mounts_the_ca_as_a_file_that_rotation_updates() -> None:
    config = dataclasses.replace(CONFIG, ingest_ca_configmap="stitchfleet-ingest-ca")
    pod = make_pod(containers=[{"name": "trainer", "image": "tf"}, {"name": "sidecar", "image": "log"}])
    result = apply_patch(pod, mutate(pod, config).patch)
    assert_valid_pod(result)
    volume = next(volume for volume in result["spec"]["volumes"] if volume["name"] == CA_VOLUME)
    # Optional: a pod in a namespace the operator has not written its copy to yet still starts (the variable).
    items = [{"key": "ca.crt", "path": "ca.crt"}]
    assert volume["configMap"] == {"name": "stitchfleet-ingest-ca", "items": items, "optional": True}
    for container in result["spec"]["containers"]:
        env = env_of(container)
        assert env["STITCHFLEET_INGEST_CA_FILE"] == f"{CA_MOUNT}/ca.crt"
        assert env["STITCHFLEET_INGEST_CA"] == CONFIG.ingest_ca  # the fallback until the file exists
        assert {"name": CA_VOLUME, "mountPath": CA_MOUNT, "readOnly": True} in container["volumeMounts"]
    assert apply_patch(result, mutate(result, config).patch) == result  # a second pass changes nothing
    # Without a CA (system CAs) or without a ConfigMap name nothing is mounted.
    for other in (CONFIG, dataclasses.replace(config, ingest_ca="")):
        plain = apply_patch(pod, mutate(pod, other).patch)
        assert CA_VOLUME not in {volume["name"] for volume in plain["spec"]["volumes"]}
        assert "STITCHFLEET_INGEST_CA_FILE" not in env_of(plain["spec"]["containers"][0])
