"""The chart as Helm and Kubernetes see it: lint, strict schema validation of every rendered
manifest for Kubernetes 1.29 and 1.33, values.schema.json rejecting bad values, the CRD, names,
labels and NOTES.

Input: helm/stitchfleet, rendered offline by Helm's Go engine (helm-python-sdk) once per values set
(see conftest.py). Output: pass/fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
from chart_render import CHART_DIR, VALUE_SETS, Rendered, render_chart, rendered_set

KUBE_VERSIONS = ("1.29", "1.33")

# Custom resources of other projects: kubernetes-validate bundles only the core API schemas, so
# these kinds have none. Their content is asserted field by field in test_chart_policies.py.
KINDS_WITHOUT_CORE_SCHEMA = frozenset(
    {
        ("cert-manager.io/v1", "Issuer"),
        ("cert-manager.io/v1", "Certificate"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
    }
)

STANDARD_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
)


def _validate(doc: dict[str, Any], version: str) -> None:
    try:
        validated = kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = ".".join(str(part) for part in err.path)
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for {version} at {where}: {err.message}")
    assert validated == version, f"validated against {validated}, not {version}"


def test_bundled_schemas_cover_the_tested_versions() -> None:
    offered = {kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()}
    assert set(KUBE_VERSIONS) <= offered


@pytest.mark.parametrize("kube_version", ["v1.29.0", "v1.33.0"])
@pytest.mark.parametrize("set_name", sorted(VALUE_SETS))
def test_lint_is_clean(set_name: str, kube_version: str) -> None:
    values, _, namespace = VALUE_SETS[set_name]
    report = helm.lint(CHART_DIR, values, strict=True, namespace=namespace, kube_version=kube_version)
    problems = [msg for msg in report["messages"] if msg["severity"] >= 2]
    assert report["total_charts_linted"] == 1
    assert problems == [] and report["errors"] == []


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_manifest_validates_strictly(rendered: Rendered, version: str) -> None:
    checked = 0
    for doc in rendered.manifests + rendered.crds:
        if (doc["apiVersion"], doc["kind"]) in KINDS_WITHOUT_CORE_SCHEMA:
            continue
        _validate(doc, version)
        checked += 1
    assert checked >= 10


def test_skipped_kinds_really_lack_a_core_schema(full_render: Rendered) -> None:
    skipped = [doc for doc in full_render.manifests if (doc["apiVersion"], doc["kind"]) in KINDS_WITHOUT_CORE_SCHEMA]
    assert {(doc["apiVersion"], doc["kind"]) for doc in skipped} == KINDS_WITHOUT_CORE_SCHEMA
    for doc in skipped:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(doc, "1.33", strict=True)


def test_strict_validation_rejects_an_unknown_field(default_render: Rendered) -> None:
    deployment = default_render.one("Deployment")
    misspelled = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelled, "1.29", strict=True)


def test_optional_parts_follow_their_switches(default_render: Rendered, full_render: Rendered) -> None:
    optional = {"Issuer", "Certificate", "StatefulSet", "ServiceMonitor"}
    assert not optional & {doc["kind"] for doc in default_render.manifests}
    assert optional <= {doc["kind"] for doc in full_render.manifests}
    assert default_render.of_kind("CronJob") and not rendered_set("external-db").of_kind("CronJob")


BAD_VALUES = [
    ("webhook:\n  timeoutSeconds: 30\n", "/webhook/timeoutSeconds"),
    ("webhook:\n  timeoutSeconds: 0\n", "/webhook/timeoutSeconds"),
    ("replicas: 2\n", "additional properties 'replicas' not allowed"),
    ("webhook:\n  failurePolicy: Fail\n", "additional properties 'failurePolicy' not allowed"),
    ('certManager:\n  enabled: "yes"\n', "/certManager/enabled"),
    ('webhook:\n  port: "8443"\n', "/webhook/port"),
    ("logLevel: TRACE\n", "/logLevel"),
    ("report:\n  schedule: every monday\n", "/report/schedule"),
    ("database:\n  secretName: Telemetry_DB\n", "/database/secretName"),
    ("postgresql:\n  enabled: true\ndatabase:\n  url: postgresql://u:p@elsewhere/db\n", "/database/url"),
    ("postgresql:\n  password: 'p@ss:word'\n", "/postgresql/password"),
    ("serviceAccount:\n  create: false\n", "/serviceAccount/name"),
    ("extraSettings:\n  BACKEND: cpu\n", "invalid propertyName 'BACKEND'"),
    ("extraSettings:\n  STITCHFLEET_DB_URL: postgresql://u:p@h/db\n", "invalid propertyName 'STITCHFLEET_DB_URL'"),
    ("extraSettings:\n  STITCHFLEET_WEBHOOK_PORT: '9443'\n", "invalid propertyName 'STITCHFLEET_WEBHOOK_PORT'"),
]


@pytest.mark.parametrize(("text", "complaint"), BAD_VALUES, ids=[c for _, c in BAD_VALUES])
def test_bad_values_file_is_rejected(chart: Any, tmp_path: Path, text: str, complaint: str) -> None:
    values_file = tmp_path / "bad-values.yaml"
    values_file.write_text(text)
    values = helm.values_from_yaml(values_file.read_text())
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema(values)
    # An install renders through the same check: nothing is produced from bad values.
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.render(values, name="bad", namespace="ops")


def test_every_value_set_passes_the_schema(chart: Any) -> None:
    for values, _, _ in VALUE_SETS.values():
        chart.validate_schema(values)


def _crd(rendered: Rendered, name: str) -> dict[str, Any]:
    (crd,) = [crd for crd in rendered.crds if crd["metadata"]["name"] == name]
    return crd


def test_crd_matches_the_contract(default_render: Rendered) -> None:
    assert sorted(crd["metadata"]["name"] for crd in default_render.crds) == [
        "savingsreports.stitchfleet.io",
        "stitchquarantines.stitchfleet.io",
    ]
    crd = _crd(default_render, "savingsreports.stitchfleet.io")
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "savingsreports.stitchfleet.io"
    assert (spec["group"], spec["scope"]) == ("stitchfleet.io", "Namespaced")
    assert spec["names"]["kind"] == "SavingsReport" and spec["names"]["plural"] == "savingsreports"
    assert spec["names"]["shortNames"] == ["sfr"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {col["jsonPath"] for col in version["additionalPrinterColumns"]}
    assert {".spec.week", ".status.tasks", ".status.gpuHoursSaved"} <= columns
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    expected = {"tasks", "jobs", "gpuHoursSaved", "grossGpuHoursSaved", "revertedJobs", "revertReasons", "generatedAt"}
    assert set(status) == expected | {"cpuCoreHoursSaved", "grossCpuCoreHoursSaved"}


def _report_schema(rendered: Rendered) -> dict[str, Any]:
    schema: dict[str, Any] = _crd(rendered, "savingsreports.stitchfleet.io")["spec"]["versions"][0]["schema"]
    return schema["openAPIV3Schema"]


def test_crd_schema_accepts_a_report_and_rejects_bad_ones(default_render: Rendered) -> None:
    validator = jsonschema.Draft7Validator(_report_schema(default_render))
    report = {
        "spec": {"week": "2026-W47"},
        "status": {
            "tasks": 48,
            "jobs": 6,
            "gpuHoursSaved": 112.5,
            "grossGpuHoursSaved": 118.0,
            "revertedJobs": 1,
            "revertReasons": {"numeric mismatch": 1},
            "generatedAt": "2026-11-23T06:00:00Z",
        },
    }
    validator.validate(report)
    assert not validator.is_valid({"spec": {"week": "2026-47"}})
    assert not validator.is_valid({"spec": {"week": "2026-W47"}, "status": {"revertReasons": {"nan": "one"}}})
    assert not validator.is_valid({"spec": {"week": "2026-W47"}, "status": {"tasks": -1}})


def test_quarantine_crd_accepts_a_request_and_rejects_bad_ones(default_render: Rendered) -> None:
    crd = _crd(default_render, "stitchquarantines.stitchfleet.io")
    assert crd["spec"]["names"]["kind"] == "StitchQuarantine" and crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    validator = jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"])
    request = {"fingerprint": "c0ffee42", "action": "confirm", "reason": "reproduced on A100", "requestedBy": "alice"}
    validator.validate({"spec": request, "status": {"phase": "Applied", "observedGeneration": 1}})
    validator.validate({"spec": {**request, "action": "clear"}})
    for bad in ({"action": "revert"}, {"fingerprint": ""}, {"fingerprint": "a" * 65}, {"requestedBy": "a b"}):
        assert not validator.is_valid({"spec": {**request, **bad}}), bad
    assert not validator.is_valid({"spec": {key: value for key, value in request.items() if key != "reason"}})


def test_names_and_standard_labels(rendered: Rendered) -> None:
    for doc in rendered.manifests:
        meta = doc["metadata"]
        assert len(meta["name"]) <= 63, meta["name"]
        labels = meta.get("labels", {})
        missing = [key for key in STANDARD_LABELS if key not in labels]
        assert not missing, f"{doc['kind']}/{meta['name']} lacks {missing}"
        assert labels["app.kubernetes.io/instance"] == rendered.release
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if doc["kind"] not in {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}:
            assert meta["namespace"] == rendered.namespace


@pytest.mark.parametrize(
    ("set_name", "fullname"), [("default", "stitchfleet"), ("full", "fleet-ops"), ("external-db", "prod-fleet")]
)
def test_full_name_rules(set_name: str, fullname: str) -> None:
    rendered = rendered_set(set_name)
    assert rendered.one("Deployment")["metadata"]["name"] == fullname
    assert rendered.one("MutatingWebhookConfiguration")["metadata"]["name"] == fullname


def test_longest_release_name_keeps_names_valid() -> None:
    release = "r" * 53  # Helm's own limit on release names
    rendered = render_chart({"postgresql": {"enabled": True}}, release, "ops")
    for doc in rendered.manifests:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
    # A CronJob's Jobs append 11 characters to its name: it may have at most 52.
    assert len(rendered.one("CronJob")["metadata"]["name"]) <= 52
    # A StatefulSet's controller-revision-hash label is its name plus 11 characters.
    assert len(rendered.one("StatefulSet")["metadata"]["name"]) <= 52
    for doc in rendered.manifests:
        if (doc["apiVersion"], doc["kind"]) not in KINDS_WITHOUT_CORE_SCHEMA:
            _validate(doc, "1.33")


def test_notes_name_what_the_user_needs(rendered: Rendered) -> None:
    fullname = rendered.one("Deployment")["metadata"]["name"]
    assert 'stitchfleet.io/enabled: "true"' in rendered.notes
    assert f"deployment/{fullname}" in rendered.notes
    assert f"https://{fullname}.{rendered.one('Deployment')['metadata']['namespace']}.svc/ingest/v1" in rendered.notes
    assert rendered.one("ConfigMap")["data"]["STITCHFLEET_INGEST_AUDIENCE"] in rendered.notes
    assert "{{" not in rendered.notes and "<no value>" not in rendered.notes


def test_no_template_left_unrendered(rendered: Rendered) -> None:
    for path, text in rendered.files.items():
        assert "<no value>" not in text, path
        assert not re.search(r"\{\{.*\}\}", text), path


def test_chart_directory_is_complete() -> None:
    for name in ("Chart.yaml", "values.yaml", "values.schema.json", "templates/_helpers.tpl", "templates/NOTES.txt"):
        assert (CHART_DIR / name).is_file(), name


def _shapes(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node that declares properties, except conditional constraints under allOf."""
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
        for key, child in node.items():
            if key != "allOf":
                yield from _shapes(child, f"{path}/{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _shapes(child, f"{path}/{index}")


def test_schema_closes_every_object(chart: Any) -> None:
    shapes = dict(_shapes(chart.schema, ""))
    assert len(shapes) >= 15
    open_objects = [path for path, node in shapes.items() if node.get("additionalProperties") is not False]
    assert open_objects == []
