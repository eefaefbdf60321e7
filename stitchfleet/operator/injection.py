"""What the admission webhook does to an opted-in pod, as pure data.

Input: a Pod as the API server sends it in an AdmissionReview (a JSON dict) and an
`InjectionConfig`. Output: a `Mutation`: RFC 6902 JSONPatch operations (paths
escaped per RFC 6901) that give every container the STITCHFLEET_* identity, the
operator's ingestion endpoint (URL and CA: a variable, and with `ingest_ca_configmap` also a file
mounted from the ConfigMap the operator keeps current in the pod's namespace, ca_publisher.py, so a
rotated CA reaches running pods) with a projected ServiceAccount token bound to its audience, a
writable state dir for the spool (an emptyDir: it outlives a container's restart), the kernel
cache (STITCHFLEET_CACHE_DIR: in that emptyDir, so each pod compiles its clusters once; or, with
`kernel_cache_claim`, on that PersistentVolumeClaim, which every pod of the namespace mounts, so a
job's second pod and its restarts reuse the first one's kernels), and the boot shim on PYTHONPATH;
plus warnings for the user.
The pod gets no database credentials: the operator is the only writer.
The patch never overwrites a variable the user set, an explicit
`stitchfleet.io/enabled: "false"` always wins, an annotated pod gets an empty patch
(a second pass changes nothing), and a malformed pod gets an empty patch and a
warning: the webhook never blocks a pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stitchfleet import __version__
from stitchfleet.operator.identity import GPU_RESOURCE, LABEL_ENABLED, MalformedPodError, gpu_count, identify
from stitchfleet.operator.ingest import BASE as INGEST_BASE
from stitchfleet.operator.tls import CA_FILE
from stitchfleet.settings import Settings

LABEL_TEAM = "stitchfleet.io/team"
LABEL_MODEL = "stitchfleet.io/model"
ANNOTATION_INJECTED = "stitchfleet.io/injected"

SHIM_VOLUME = "stitchfleet-shim"
SHIM_MOUNT = "/opt/stitchfleet"
SHIM_PATH = f"{SHIM_MOUNT}/shim"
SHIM_COMMAND = ("stitchfleet", "shim", "install", SHIM_MOUNT)
TOKEN_VOLUME = "stitchfleet-token"
TOKEN_MOUNT = "/var/run/secrets/stitchfleet.io/token"
TOKEN_FILE = "token"
STATE_VOLUME = "stitchfleet-state"
STATE_MOUNT = "/var/lib/stitchfleet"
KERNEL_VOLUME = "stitchfleet-kernels"
KERNEL_MOUNT = "/var/cache/stitchfleet"
CA_VOLUME = "stitchfleet-ingest-ca"
CA_MOUNT = "/var/run/secrets/stitchfleet.io/ca"
CA_FILE_NAME = "ca.crt"
PYTHONPATH = "PYTHONPATH"

Operation = dict[str, Any]
EnvVar = dict[str, Any]


@dataclass(frozen=True)
class InjectionConfig:
    """The operator's side of the injection: values that do not come from the pod."""

    cluster: str
    shim_image: str
    ingest_url: str = ""
    ingest_ca: str = ""
    ingest_audience: str = "stitchfleet"
    token_seconds: int = 3600
    kernel_cache_claim: str = ""  # a PVC in the pod's namespace shared by its pods' kernel caches (empty: none)
    ingest_ca_configmap: str = ""  # the CA's ConfigMap in the pod's namespace, mounted as a file (empty: none)
    version: str = __version__

    @property
    def kernel_cache_dir(self) -> str:
        """STITCHFLEET_CACHE_DIR in the pod: the shared claim's mount, else the pod's state emptyDir (the
        default, ~/.cache, may be read-only in a user's image, and a container restart would lose it)."""
        return KERNEL_MOUNT if self.kernel_cache_claim else f"{STATE_MOUNT}/kernels"

    @classmethod
    def from_settings(cls, current: Settings) -> InjectionConfig:
        """The config the operator process runs with; the CA is read from the webhook's TLS dir."""
        ca_file = current.webhook_tls_dir / CA_FILE
        return cls(
            cluster=current.cluster,
            shim_image=current.shim_image,
            ingest_url=ingest_url(current.webhook_service, current.operator_namespace),
            ingest_ca=ca_file.read_text() if ca_file.is_file() else "",
            ingest_audience=current.ingest_audience,
            token_seconds=current.ingest_token_seconds,
            kernel_cache_claim=current.kernel_cache_claim,
            ingest_ca_configmap=current.ingest_ca_configmap,
        )

    @property
    def mounts_ca(self) -> bool:
        """The pods get the CA as a file too (there is a CA, and a ConfigMap to hold it)."""
        return bool(self.ingest_ca and self.ingest_ca_configmap)


def ingest_url(service: str, namespace: str) -> str:
    """The endpoint pods ship to: the webhook's Service (port 443), its certificate's first name."""
    return f"https://{service}.{namespace}.svc{INGEST_BASE}"


@dataclass(frozen=True)
class Mutation:
    """A JSONPatch (empty: leave the pod as it is) and warnings to show the user."""

    patch: list[Operation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def escape(token: str | int) -> str:
    """One JSON Pointer reference token (RFC 6901): '~' -> '~0', '/' -> '~1'."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    """A JSON Pointer from unescaped tokens."""
    return "".join("/" + escape(token) for token in tokens)


def mutate(pod: Any, config: InjectionConfig) -> Mutation:
    """The patch that opts `pod` into stitchfleet; empty when it is opted out or already patched."""
    try:
        return _plan(pod, config)
    except MalformedPodError as err:
        return Mutation(warnings=[f"stitchfleet: pod left unchanged: {err}"])


def _plan(pod: Any, config: InjectionConfig) -> Mutation:
    pod = _mapping(pod, "the pod")
    metadata = _mapping(pod.get("metadata", {}), "metadata")
    labels = _string_map(metadata.get("labels"), "metadata.labels")
    annotations = _string_map(metadata.get("annotations"), "metadata.annotations")
    if not _opted_in(labels, annotations) or ANNOTATION_INJECTED in annotations:
        return Mutation()
    spec = _mapping(pod.get("spec"), "spec")
    containers = _containers(spec)
    identity = _identity_env(metadata, labels, config)
    ops = _annotation_ops(pod, metadata, config)
    ops += _pod_level_ops(spec, config)
    warnings: list[str] = []
    for index, container in enumerate(containers):
        container_ops, container_warnings = _container_ops(index, container, identity, config)
        ops += container_ops
        warnings += container_warnings
    return Mutation(ops, warnings)


def _opted_in(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    # An explicit "false", on the label or the annotation, beats any "true" elsewhere.
    if "false" in (labels.get(LABEL_ENABLED, "").lower(), annotations.get(LABEL_ENABLED, "").lower()):
        return False
    return labels.get(LABEL_ENABLED, "").lower() == "true"


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedPodError(f"{where} is {type(value).__name__}, expected an object")
    return value


def _optional_list(value: Any, where: str) -> list[dict[str, Any]] | None:
    """A list of objects, or None when absent; anything else is malformed."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise MalformedPodError(f"{where} is {type(value).__name__}, expected a list")
    return [_mapping(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    found = _mapping(value, where)
    for key, item in found.items():
        if not isinstance(item, str):
            raise MalformedPodError(f"{where}[{key!r}] is {type(item).__name__}, expected a string")
    return found


def _named(items: list[dict[str, Any]] | None, where: str) -> set[str]:
    names = set()
    for i, item in enumerate(items or []):
        name = item.get("name")
        if not isinstance(name, str):
            raise MalformedPodError(f"{where}[{i}].name is missing or not a string")
        names.add(name)
    return names


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    containers = _optional_list(spec.get("containers"), "spec.containers")
    if not containers:
        raise MalformedPodError("spec.containers is missing or empty")
    if SHIM_VOLUME in _named(containers, "spec.containers"):
        raise MalformedPodError(f"a container is named {SHIM_VOLUME!r}, the name of the boot shim's init container")
    return containers


def _annotation_ops(pod: dict[str, Any], metadata: dict[str, Any], config: InjectionConfig) -> list[Operation]:
    if "metadata" not in pod:
        return [_add(pointer("metadata"), {"annotations": {ANNOTATION_INJECTED: config.version}})]
    if metadata.get("annotations") is None:
        return [_add(pointer("metadata", "annotations"), {ANNOTATION_INJECTED: config.version})]
    return [_add(pointer("metadata", "annotations", ANNOTATION_INJECTED), config.version)]


def _pod_level_ops(spec: dict[str, Any], config: InjectionConfig) -> list[Operation]:
    token = {"audience": config.ingest_audience, "expirationSeconds": config.token_seconds, "path": TOKEN_FILE}
    volumes = [
        {"name": SHIM_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}},
        # Bound to the pod and to our audience: useless against the API server or another service.
        {"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}},
        {"name": STATE_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    if config.kernel_cache_claim:
        volumes.append({"name": KERNEL_VOLUME, "persistentVolumeClaim": {"claimName": config.kernel_cache_claim}})
    if config.mounts_ca:
        # Optional: the pod starts before the operator's first copy lands in a new namespace (the client then
        # reads STITCHFLEET_INGEST_CA); the kubelet fills the file once it exists and updates it on rotation.
        items = [{"key": CA_FILE_NAME, "path": CA_FILE_NAME}]
        ca_map = {"name": config.ingest_ca_configmap, "items": items, "optional": True}
        volumes.append({"name": CA_VOLUME, "configMap": ca_map})
    ops = _append_named(spec, "volumes", volumes)
    return ops + _append_named(spec, "initContainers", [_init_container(config)])


def _append_named(spec: dict[str, Any], key: str, items: list[dict[str, Any]]) -> list[Operation]:
    """Adds each of `items` to the list spec[key] unless an entry of its name is there already."""
    existing = _optional_list(spec.get(key), f"spec.{key}")
    present = _named(existing, f"spec.{key}")
    missing = [item for item in items if item["name"] not in present]
    if not missing:
        return []
    if existing is None:
        return [_add(pointer("spec", key), missing)]
    return [_add(pointer("spec", key, "-"), item) for item in missing]


# The images' non-root user (USER 10001 in images/*.Containerfile); the shim is world-readable.
SHIM_USER = 10001


def _init_container(config: InjectionConfig) -> dict[str, Any]:
    return {
        "name": SHIM_VOLUME,
        "image": config.shim_image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(SHIM_COMMAND),
        "volumeMounts": [{"name": SHIM_VOLUME, "mountPath": SHIM_MOUNT}],
        # Limits keep the pod admissible under a ResourceQuota; copying a package needs little.
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
        # PodSecurity "restricted": a namespace that enforces it admits the pod with this container.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": SHIM_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _identity_env(metadata: dict[str, Any], labels: Mapping[str, str], config: InjectionConfig) -> list[EnvVar]:
    env = [
        _literal("STITCHFLEET_ENABLED", "1"),
        _literal("STITCHFLEET_CLUSTER", config.cluster),
        _field_ref("STITCHFLEET_NAMESPACE", "metadata.namespace"),
        _field_ref("STITCHFLEET_POD_NAME", "metadata.name"),
    ]
    identity = identify(metadata)
    if identity.job_name:
        env.append(_literal("STITCHFLEET_JOB_NAME", identity.job_name))
    env.append(_job_uid(identity.job_uid))
    for name, label in (("STITCHFLEET_TEAM", LABEL_TEAM), ("STITCHFLEET_MODEL", LABEL_MODEL)):
        if labels.get(label):
            env.append(_literal(name, labels[label]))
    env.append(_literal("STITCHFLEET_STATE_DIR", STATE_MOUNT))
    env.append(_literal("STITCHFLEET_CACHE_DIR", config.kernel_cache_dir))
    if config.ingest_url:
        env.append(_literal("STITCHFLEET_INGEST_URL", config.ingest_url))
        env.append(_literal("STITCHFLEET_INGEST_TOKEN_FILE", f"{TOKEN_MOUNT}/{TOKEN_FILE}"))
    if config.ingest_ca:
        env.append(_literal("STITCHFLEET_INGEST_CA", config.ingest_ca))
    if config.mounts_ca:
        env.append(_literal("STITCHFLEET_INGEST_CA_FILE", f"{CA_MOUNT}/{CA_FILE_NAME}"))
    return env


def _job_uid(owner_uid: str | None) -> EnvVar:
    # The operator keys the job the same way (identity.py): the owner's uid, else the pod's own
    # uid, which the API server assigns after admission: the kubelet resolves it.
    if owner_uid:
        return _literal("STITCHFLEET_JOB_UID", owner_uid)
    return _field_ref("STITCHFLEET_JOB_UID", "metadata.uid")


def _container_ops(
    index: int, container: dict[str, Any], identity: list[EnvVar], config: InjectionConfig
) -> tuple[list[Operation], list[str]]:
    where = f"spec.containers[{index}]"
    base = ("spec", "containers", index)
    env = _optional_list(container.get("env"), f"{where}.env")
    _named(env, f"{where}.env")
    gpus, warnings = _gpus(container, where)
    wanted = [*identity, _literal("STITCHFLEET_GPUS_PER_RANK", gpus)] if gpus else list(identity)
    path_var, path_ops, path_warnings = _pythonpath(base, env, "envFrom" in container, where)
    ops = _env_ops(base, env, wanted + path_var) + path_ops
    mount_ops, mount_warnings = _mount_ops(base, container, where, config)
    return ops + mount_ops, warnings + path_warnings + mount_warnings


def _env_ops(base: tuple[str | int, ...], env: list[dict[str, Any]] | None, wanted: list[EnvVar]) -> list[Operation]:
    if env is None:
        return [_add(pointer(*base, "env"), wanted)] if wanted else []
    present = {item["name"] for item in env}
    return [_add(pointer(*base, "env", "-"), var) for var in wanted if var["name"] not in present]


def _gpus(container: dict[str, Any], where: str) -> tuple[str, list[str]]:
    """The container's GPU count as text ("0" without a GPU) and warnings."""
    resources = _mapping(container.get("resources", {}), f"{where}.resources")
    limits = _mapping(resources.get("limits") or {}, f"{where}.resources.limits")
    requests = _mapping(resources.get("requests") or {}, f"{where}.resources.requests")
    raw = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, 0))
    count = gpu_count(raw)
    if count is None:
        return "", [
            f"stitchfleet: {where} has {GPU_RESOURCE}={raw!r}, not a GPU count; STITCHFLEET_GPUS_PER_RANK unset"
        ]
    return str(count), []


def _pythonpath(
    base: tuple[str | int, ...], env: list[dict[str, Any]] | None, has_env_from: bool, where: str
) -> tuple[list[EnvVar], list[Operation], list[str]]:
    """PYTHONPATH with the shim first: a new variable, an edit of the user's value, or a warning."""
    # Kubernetes uses the last entry of a repeated name.
    entries = env or []
    found = [i for i, item in enumerate(entries) if item["name"] == PYTHONPATH]
    if not found:
        # $(PYTHONPATH) keeps a value the container gets through envFrom (kubelet expands it).
        value = f"{SHIM_PATH}:$({PYTHONPATH})" if has_env_from else SHIM_PATH
        return [_literal(PYTHONPATH, value)], [], []
    entry = entries[found[-1]]
    if "valueFrom" in entry:
        return [], [], [f"stitchfleet: {where} sets PYTHONPATH from valueFrom; boot shim not on PYTHONPATH"]
    value = entry.get("value", "")
    if not isinstance(value, str):
        raise MalformedPodError(f"{where}.env PYTHONPATH value is {type(value).__name__}, expected a string")
    if SHIM_PATH in value.split(":"):
        return [], [], []
    path = pointer(*base, "env", found[-1], "value")
    new_value = f"{SHIM_PATH}:{value}" if value else SHIM_PATH
    return [], [{"op": "replace" if "value" in entry else "add", "path": path, "value": new_value}], []


def _mount_ops(
    base: tuple[str | int, ...], container: dict[str, Any], where: str, config: InjectionConfig
) -> tuple[list[Operation], list[str]]:
    wanted: list[dict[str, Any]] = [
        {"name": SHIM_VOLUME, "mountPath": SHIM_MOUNT, "readOnly": True},
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT, "readOnly": True},
        {"name": STATE_VOLUME, "mountPath": STATE_MOUNT},
    ]
    if config.kernel_cache_claim:
        wanted.append({"name": KERNEL_VOLUME, "mountPath": KERNEL_MOUNT})
    if config.mounts_ca:
        wanted.append({"name": CA_VOLUME, "mountPath": CA_MOUNT, "readOnly": True})
    what = {
        CA_VOLUME: "ingestion CA",
        SHIM_VOLUME: "boot shim",
        TOKEN_VOLUME: "ingestion token",
        STATE_VOLUME: "telemetry spool",
        KERNEL_VOLUME: "shared kernel cache",
    }
    mounts = _optional_list(container.get("volumeMounts"), f"{where}.volumeMounts")
    if mounts is None:
        return [_add(pointer(*base, "volumeMounts"), wanted)], []
    ops: list[Operation] = []
    warnings: list[str] = []
    for mount in wanted:
        if any(item.get("name") == mount["name"] for item in mounts):
            continue
        if any(item.get("mountPath") == mount["mountPath"] for item in mounts):
            path, name = mount["mountPath"], what[mount["name"]]
            warnings.append(f"stitchfleet: {where} already mounts a volume at {path}; {name} not mounted")
            continue
        ops.append(_add(pointer(*base, "volumeMounts", "-"), mount))
    return ops, warnings


def _literal(name: str, value: str) -> EnvVar:
    return {"name": name, "value": value}


def _field_ref(name: str, field_path: str) -> EnvVar:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def _add(path: str, value: Any) -> Operation:
    return {"op": "add", "path": path, "value": value}
