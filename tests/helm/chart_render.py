"""The chart test harness: renders helm/stitchfleet offline with Helm's own Go engine (helm-python-sdk).

Input: the chart directory and the named values sets below. Output: `Rendered` objects (parsed
manifests, CRDs and NOTES); `rendered_set` renders each named set once per session.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "stitchfleet"

# name -> (values, release name, namespace). Together they switch every optional part on once.
VALUE_SETS: dict[str, tuple[dict[str, Any], str, str]] = {
    # A release named like the chart: the full name is just "stitchfleet".
    "default": ({}, "stitchfleet", "stitchfleet-system"),
    "full": (
        {
            "fullnameOverride": "fleet-ops",
            "clusterName": "gpu-east",
            "certManager": {"enabled": True},
            "postgresql": {"enabled": True, "storage": {"size": "50Gi", "storageClassName": "fast-ssd"}},
            "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
            "webhook": {"excludeNamespaces": ["sandbox", "ci"]},
            "shimImage": {"repository": "registry.example/stitchfleet-shim", "tag": "0.1.0-slim"},
            "kernelCache": {"claimName": "team-kernels"},
            "imagePullSecrets": [{"name": "regcred"}],
            "podAnnotations": {"example.com/owner": "ml-platform"},
            "podLabels": {"team": "ml-platform"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
            "priorityClassName": "ml-infra-critical",
            "extraSettings": {"STITCHFLEET_BACKEND": "cpu"},
        },
        "sf",
        "ops",
    ),
    "external-db": (
        {
            "nameOverride": "fleet",
            "database": {
                "secretName": "telemetry-db",
                "secretKey": "dsn",
                "url": "postgresql+psycopg://sf:secret@db.example.com:5432/telemetry",
            },
            "report": {"enabled": False},
            "serviceAccount": {"create": False, "name": "platform-operator"},
            "webhook": {"timeoutSeconds": 3},
            "logLevel": "DEBUG",
        },
        "prod",
        "ml-platform",
    ),
}


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate mapping keys (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        duplicates = sorted({str(key) for key in keys if keys.count(key) > 1})
        if duplicates:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicates}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def parse_documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of one rendered template."""
    return [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc]


@dataclass(frozen=True)
class Rendered:
    """One offline render of the chart: templates parsed, CRDs from crds/, NOTES.txt as text."""

    name: str
    values: dict[str, Any]
    release: str
    namespace: str
    files: dict[str, str]
    manifests: list[dict[str, Any]]
    crds: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.manifests if doc["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [doc for doc in self.of_kind(kind) if name is None or doc["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''} in set {self.name}, found {len(found)}"
        return found[0]


def render_chart(values: dict[str, Any], release: str, namespace: str, name: str = "adhoc") -> Rendered:
    """Renders the chart with `values` (schema-checked by Helm) and parses every manifest."""
    with helm.Chart.load(CHART_DIR) as chart:
        files = chart.render(values, name=release, namespace=namespace)
        crds = [doc for crd in chart.crds for doc in parse_documents(crd["data"])]
    notes = files.pop("stitchfleet/templates/NOTES.txt", "")
    manifests = [doc for text in files.values() for doc in parse_documents(text)]
    return Rendered(name, values, release, namespace, files, manifests, crds, notes)


@functools.cache
def rendered_set(name: str) -> Rendered:
    values, release, namespace = VALUE_SETS[name]
    return render_chart(values, release, namespace, name)
