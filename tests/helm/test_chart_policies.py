"""What the chart promises beyond schema validity: the webhook's safety settings, TLS wiring,
least-privilege RBAC, pod hardening, the settings contract with the operator, the database Secret,
the report CronJob and the ServiceMonitor.

Input: the chart rendered offline once per values set (see conftest.py). Output: pass/fail.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

import pytest
from chart_render import CHART_DIR, VALUE_SETS, Rendered, render_chart

SYSTEM_NAMESPACES = {"kube-system", "kube-public", "kube-node-lease"}

# The operator's settings, by the contract with the operator/webhook engineer.
CONTRACT_SETTINGS = {
    "STITCHFLEET_WEBHOOK_PORT",
    "STITCHFLEET_WEBHOOK_TLS_DIR",
    "STITCHFLEET_WEBHOOK_SELF_SIGNED",
    "STITCHFLEET_WEBHOOK_CONFIG_NAME",
    "STITCHFLEET_WEBHOOK_SERVICE",
    "STITCHFLEET_HEALTH_PORT",
    "STITCHFLEET_METRICS_PORT",
    "STITCHFLEET_CLUSTER",
    "STITCHFLEET_SHIM_IMAGE",
    "STITCHFLEET_INGEST_AUDIENCE",
    "STITCHFLEET_INGEST_TOKEN_SECONDS",
    "STITCHFLEET_INGEST_CA_CONFIGMAP",
}

READ = {"get", "list", "watch"}
# (apiGroup, resource) -> verbs: everything the operator may do cluster-wide, and nothing more.
CLUSTER_PERMISSIONS = {
    ("", "pods"): READ,
    ("batch", "jobs"): READ,
    ("kubeflow.org", "tfjobs"): READ,
    ("kubeflow.org", "mpijobs"): READ,
    ("", "events"): {"create", "patch"},
    # The ingestion endpoint: who a pod's token is (the pod itself is read with pods get).
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"get", "patch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): READ,
    ("", "namespaces"): {"list", "watch"},
    # The ingestion CA's copy in each namespace with opted-in pods (patch limited to its name, below).
    ("", "configmaps"): {"create", "patch"},
    # StitchQuarantine requests (GitOps' confirm/clear): read anywhere, applied from the release namespace only.
    ("stitchfleet.io", "stitchquarantines"): READ,
}
NAMESPACE_PERMISSIONS = {
    ("coordination.k8s.io", "leases"): READ | {"create", "update", "patch"},
    ("", "configmaps"): {"get"},
    ("", "secrets"): {"get", "patch", "create"},  # self-signed mode: its webhook material's Secret
    # SavingsReports are written in the release namespace only.
    ("stitchfleet.io", "savingsreports"): READ | {"create", "patch", "update"},
    ("stitchfleet.io", "savingsreports/status"): READ | {"create", "patch", "update"},
    ("stitchfleet.io", "stitchquarantines/status"): {"patch"},
}


def _generates_password(rendered: Rendered) -> bool:
    """The bundled PostgreSQL with a password the operator pod's init container generates."""
    deployment = rendered.one("Deployment")["spec"]["template"]["spec"]
    return any(init["name"] == "password-secret" for init in deployment.get("initContainers", []))


def _permissions(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def _pod_specs(rendered: Rendered) -> dict[str, dict[str, Any]]:
    specs = {
        f"Deployment/{d['metadata']['name']}": d["spec"]["template"]["spec"] for d in rendered.of_kind("Deployment")
    }
    for sts in rendered.of_kind("StatefulSet"):
        specs[f"StatefulSet/{sts['metadata']['name']}"] = sts["spec"]["template"]["spec"]
    for cron in rendered.of_kind("CronJob"):
        specs[f"CronJob/{cron['metadata']['name']}"] = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return specs


def _operator(rendered: Rendered) -> dict[str, Any]:
    (container,) = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = [env for env in container.get("env", []) if env["name"] == name]
    return entry


def _secret_data(secret: dict[str, Any]) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


# --- webhook --------------------------------------------------------------------------------------


def test_webhook_fails_open_fast_and_without_side_effects(rendered: Rendered) -> None:
    config = rendered.one("MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["name"] == "pods.stitchfleet.io"
    assert hook["failurePolicy"] == "Ignore"
    assert 1 <= hook["timeoutSeconds"] <= 5
    assert hook["timeoutSeconds"] == rendered.values.get("webhook", {}).get("timeoutSeconds", 5)
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["reinvocationPolicy"] == "Never"
    (rule,) = hook["rules"]
    assert (rule["operations"], rule["resources"], rule["apiGroups"]) == (["CREATE"], ["pods"], [""])


def test_webhook_only_sees_opted_in_pods_outside_system_namespaces(rendered: Rendered) -> None:
    (hook,) = rendered.one("MutatingWebhookConfiguration")["webhooks"]
    assert hook["objectSelector"] == {"matchLabels": {"stitchfleet.io/enabled": "true"}}
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("kubernetes.io/metadata.name", "NotIn")
    extra = set(rendered.values.get("webhook", {}).get("excludeNamespaces", []))
    assert set(expression["values"]) == SYSTEM_NAMESPACES | {rendered.namespace} | extra


def test_webhook_reaches_the_operator_through_the_service(rendered: Rendered) -> None:
    (hook,) = rendered.one("MutatingWebhookConfiguration")["webhooks"]
    target = hook["clientConfig"]["service"]
    service = rendered.one("Service", target["name"])
    assert target["namespace"] == rendered.namespace and target["path"] == "/mutate"
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == target["port"]]
    assert (port["name"], port["targetPort"]) == ("webhook", "webhook")
    container_ports = {p["name"]: p["containerPort"] for p in _operator(rendered)["ports"]}
    assert container_ports["webhook"] == rendered.values.get("webhook", {}).get("port", 8443)
    pod_labels = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


# --- TLS ------------------------------------------------------------------------------------------


def test_self_signed_tls_is_the_operators_job(default_render: Rendered) -> None:
    config = default_render.one("MutatingWebhookConfiguration")
    assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
    settings = default_render.one("ConfigMap")["data"]
    assert settings["STITCHFLEET_WEBHOOK_SELF_SIGNED"] == "true"
    assert settings["STITCHFLEET_WEBHOOK_CONFIG_NAME"] == config["metadata"]["name"]
    volumes = {v["name"]: v for v in default_render.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["tls"]
    mounts = {m["name"]: m for m in _operator(default_render)["volumeMounts"]}
    assert mounts["tls"]["mountPath"] == settings["STITCHFLEET_WEBHOOK_TLS_DIR"]
    assert not mounts["tls"]["readOnly"]


def test_cert_manager_issues_and_injects_the_certificate(full_render: Rendered) -> None:
    config = full_render.one("MutatingWebhookConfiguration")
    certificate = full_render.one("Certificate")
    issuer = full_render.one("Issuer")
    inject_from = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert inject_from == f"{full_render.namespace}/{certificate['metadata']['name']}"
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    service = config["webhooks"][0]["clientConfig"]["service"]["name"]
    svc_dns = f"{service}.{full_render.namespace}.svc"
    assert certificate["spec"]["dnsNames"] == [svc_dns, f"{svc_dns}.cluster.local"]
    assert certificate["spec"]["secretName"] == "fleet-ops-tls"
    volumes = {v["name"]: v for v in full_render.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "fleet-ops-tls"
    assert full_render.one("ConfigMap")["data"]["STITCHFLEET_WEBHOOK_SELF_SIGNED"] == "false"


# --- RBAC -----------------------------------------------------------------------------------------


def test_cluster_role_grants_exactly_the_contract(rendered: Rendered) -> None:
    (role,) = rendered.of_kind("ClusterRole")
    assert _permissions(role) == CLUSTER_PERMISSIONS


def test_namespace_role_grants_exactly_the_contract(rendered: Rendered) -> None:
    expected = dict(NAMESPACE_PERMISSIONS)
    if rendered.one("ConfigMap")["data"]["STITCHFLEET_WEBHOOK_SELF_SIGNED"] != "true":
        # cert-manager's Secret is mounted, never read through the API; a generated database password is
        # created, never read.
        if _generates_password(rendered):
            expected[("", "secrets")] = {"create"}
        else:
            del expected[("", "secrets")]
    assert _permissions(rendered.one("Role")) == expected


def test_no_role_reads_secrets_or_uses_wildcards(rendered: Rendered) -> None:
    (cluster_role,) = rendered.of_kind("ClusterRole")
    self_signed = rendered.one("ConfigMap")["data"]["STITCHFLEET_WEBHOOK_SELF_SIGNED"] == "true"
    for role in (cluster_role, rendered.one("Role")):
        for rule in role["rules"]:
            assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"]
            if "secrets" not in rule["resources"]:
                continue
            # Only in the release namespace: its own webhook material's Secret (self-signed mode), and create
            # (which cannot be limited by name) for that one and for a generated database password.
            assert role is not cluster_role, role["metadata"]["name"]
            own = f"{rendered.one('ConfigMap')['data']['STITCHFLEET_WEBHOOK_SERVICE']}-webhook-self-signed"
            if rule["verbs"] == ["create"]:
                assert self_signed or _generates_password(rendered)
            else:
                assert self_signed and rule.get("resourceNames") == [own]


def test_the_ca_configmaps_are_patched_by_name_only_and_off_with_their_rules(rendered: Rendered) -> None:
    (role,) = rendered.of_kind("ClusterRole")
    rules = [rule for rule in role["rules"] if "configmaps" in rule["resources"]]
    name = rendered.one("ConfigMap")["data"]["STITCHFLEET_INGEST_CA_CONFIGMAP"]
    assert name.endswith("-ingest-ca") and len(name) <= 63
    assert [(rule["verbs"], rule.get("resourceNames")) for rule in rules] == [(["patch"], [name]), (["create"], None)]
    off = render_chart({"ingest": {"caConfigMap": False}}, "stitchfleet", "stitchfleet-system")
    assert off.one("ConfigMap")["data"]["STITCHFLEET_INGEST_CA_CONFIGMAP"] == ""
    (off_role,) = off.of_kind("ClusterRole")
    assert not [rule for rule in off_role["rules"] if "configmaps" in rule["resources"]]


def test_webhook_patch_is_limited_to_our_webhook_config(rendered: Rendered) -> None:
    (role,) = rendered.of_kind("ClusterRole")
    (rule,) = [r for r in role["rules"] if "mutatingwebhookconfigurations" in r["resources"]]
    assert rule["resourceNames"] == [rendered.one("MutatingWebhookConfiguration")["metadata"]["name"]]
    assert rule["resources"] == ["mutatingwebhookconfigurations"]


def test_bindings_grant_the_roles_to_the_operators_account(rendered: Rendered) -> None:
    account = rendered.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = rendered.one(kind)
        assert binding["roleRef"]["name"] == rendered.one(role_kind)["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": rendered.namespace}]
    created = [sa["metadata"]["name"] for sa in rendered.of_kind("ServiceAccount")]
    expected_created = [] if rendered.name == "external-db" else [account]
    assert created == expected_created


# --- pods -----------------------------------------------------------------------------------------


def test_every_pod_is_hardened(rendered: Rendered) -> None:
    for where, spec in _pod_specs(rendered).items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, where
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in spec.get("initContainers", []) + spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["capabilities"] == {"drop": ["ALL"]}, where
            assert {"requests", "limits"} <= container["resources"].keys(), where
            assert ":" in container["image"] and not container["image"].endswith(":latest"), where


def test_operator_deployment_shape(rendered: Rendered) -> None:
    deployment = rendered.one("Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = _operator(rendered)
    assert container["command"] == ["stitchfleet", "operator"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"webhook": 8443, "health": 8080, "metrics": 9090}
    for probe in (container["livenessProbe"], container["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    namespace_env = _env(container, "STITCHFLEET_OPERATOR_NAMESPACE")
    assert namespace_env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_settings_config_map_carries_the_contract(rendered: Rendered) -> None:
    config_map = rendered.one("ConfigMap")
    settings = config_map["data"]
    fullname = rendered.one("Deployment")["metadata"]["name"]
    assert settings.keys() >= CONTRACT_SETTINGS
    assert all(key.startswith("STITCHFLEET_") and isinstance(v, str) for key, v in settings.items())
    assert settings["STITCHFLEET_WEBHOOK_SERVICE"] == fullname
    assert settings["STITCHFLEET_WEBHOOK_CONFIG_NAME"] == fullname
    assert (settings["STITCHFLEET_WEBHOOK_PORT"], settings["STITCHFLEET_HEALTH_PORT"]) == ("8443", "8080")
    assert settings["STITCHFLEET_METRICS_PORT"] == "9090"
    assert settings["STITCHFLEET_WEBHOOK_TLS_DIR"] == "/etc/stitchfleet/tls"
    assert _operator(rendered)["envFrom"] == [{"configMapRef": {"name": config_map["metadata"]["name"]}}]
    writable = {m["mountPath"] for m in _operator(rendered)["volumeMounts"]}
    assert settings["STITCHFLEET_STATE_DIR"] in writable


def test_chosen_values_reach_the_settings(full_render: Rendered, default_render: Rendered) -> None:
    settings = full_render.one("ConfigMap")["data"]
    assert settings["STITCHFLEET_CLUSTER"] == "gpu-east"
    assert settings["STITCHFLEET_SHIM_IMAGE"] == "registry.example/stitchfleet-shim:0.1.0-slim"
    assert settings["STITCHFLEET_KERNEL_CACHE_CLAIM"] == "team-kernels"
    assert default_render.one("ConfigMap")["data"]["STITCHFLEET_KERNEL_CACHE_CLAIM"] == ""  # per-pod emptyDir
    assert settings["STITCHFLEET_BACKEND"] == "cpu"
    # By default injected pods copy the shim from the shim image, the one that carries the prebuilt op
    # (the operator image has none, so a default pod built it from source: ~5-10 s of setup per pod).
    default_shim = default_render.one("ConfigMap")["data"]["STITCHFLEET_SHIM_IMAGE"]
    assert default_shim.startswith("ghcr.io/stitchfleet/stitchfleet-shim:")
    assert default_shim != _operator(default_render)["image"]


def test_an_empty_shim_repository_uses_the_operator_image() -> None:
    rendered = render_chart({"shimImage": {"repository": ""}}, "sf", "ops")
    assert rendered.one("ConfigMap")["data"]["STITCHFLEET_SHIM_IMAGE"] == _operator(rendered)["image"]


def test_pod_restarts_when_settings_change(default_render: Rendered) -> None:
    def checksum(rendered: Rendered) -> str:
        return rendered.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/settings"]

    config_map_text = default_render.files["stitchfleet/templates/configmap.yaml"]
    assert checksum(default_render) == hashlib.sha256(config_map_text.encode()).hexdigest()
    same = render_chart({}, default_render.release, default_render.namespace)
    changed = render_chart({"clusterName": "gpu-west"}, default_render.release, default_render.namespace)
    assert checksum(same) == checksum(default_render) != checksum(changed)


# --- database -------------------------------------------------------------------------------------


def test_default_install_references_the_users_secret(default_render: Rendered) -> None:
    assert default_render.of_kind("Secret") == []
    ref = _env(_operator(default_render), "STITCHFLEET_DB_URL")["valueFrom"]["secretKeyRef"]
    # Required: a missing Secret is "secret not found" at the pod, never SQLite on an emptyDir that
    # loses acknowledged rows when the pod is replaced.
    assert ref == {"name": "stitchfleet-db", "key": "url", "optional": False}
    (report,) = default_render.one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert _env(report, "STITCHFLEET_DB_URL")["valueFrom"]["secretKeyRef"]["optional"] is False


def test_database_url_value_becomes_the_secret(external_db_render: Rendered) -> None:
    secret = external_db_render.one("Secret", "telemetry-db")
    assert _secret_data(secret) == {"dsn": "postgresql+psycopg://sf:secret@db.example.com:5432/telemetry"}
    ref = _env(_operator(external_db_render), "STITCHFLEET_DB_URL")["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("telemetry-db", "dsn")
    settings = external_db_render.one("ConfigMap")["data"]
    # Injected pods get no database URL at all: nothing tells them the Secret's name.
    assert not any("DB_SECRET" in name or "DB_URL" in name for name in settings)


def test_bundled_postgresql_is_wired_to_the_database_secret(full_render: Rendered) -> None:
    statefulset = full_render.one("StatefulSet")
    name = statefulset["metadata"]["name"]
    # A generated password is no value of the chart's: the operator pod's init container creates its Secret.
    assert full_render.of_kind("Secret") == []
    (report,) = full_render.one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    for container in (_operator(full_render), report):
        assert _env(container, "PGPASSWORD")["valueFrom"]["secretKeyRef"] == {"name": name, "key": "password"}
        url = _env(container, "STITCHFLEET_DB_URL")["value"]
        assert url == (
            f"postgresql+psycopg://stitchfleet:$(PGPASSWORD)@{name}.ops.svc.cluster.local:5432/stitchfleet?sslmode=prefer"
        )
    service = full_render.one("Service", name)
    assert service["spec"]["ports"][0]["port"] == 5432
    pod = statefulset["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    operator_labels = full_render.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= operator_labels.items()
    headless = full_render.one("Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    (container,) = pod["spec"]["containers"]
    password_ref = _env(container, "POSTGRES_PASSWORD")["valueFrom"]["secretKeyRef"]
    assert password_ref == {"name": name, "key": "password"}
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"


def test_chosen_postgresql_password_is_used() -> None:
    rendered = render_chart({"postgresql": {"enabled": True, "password": "s3cret-Pass"}}, "sf", "ops")
    assert _secret_data(rendered.one("Secret", "sf-stitchfleet-postgresql"))["password"] == "s3cret-Pass"
    assert ":s3cret-Pass@" in _secret_data(rendered.one("Secret", "stitchfleet-db"))["url"]


# --- report and monitoring ------------------------------------------------------------------------


def test_weekly_report_cron_job(default_render: Rendered) -> None:
    cron = default_render.one("CronJob")
    assert cron["spec"]["schedule"] == "0 6 * * 1"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["stitchfleet", "report", "weekly", "--format", "md"]
    assert pod["automountServiceAccountToken"] is False
    assert _env(container, "STITCHFLEET_DB_URL")["valueFrom"]["secretKeyRef"]["name"] == "stitchfleet-db"


@pytest.mark.parametrize("schedule", ["@weekly", "30 2 * * 0"])
def test_report_schedule_is_configurable(schedule: str) -> None:
    rendered = render_chart({"report": {"schedule": schedule}}, "sf", "ops")
    assert rendered.one("CronJob")["spec"]["schedule"] == schedule


def test_service_monitor_scrapes_the_metrics_port(full_render: Rendered) -> None:
    monitor = full_render.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    service = full_render.one("Service", full_render.one("Deployment")["metadata"]["name"])
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["metrics"] == 9090


def test_sqlite_on_the_emptydir_only_when_asked_for() -> None:
    rendered = render_chart({"database": {"sqlite": True}}, "stitchfleet", "stitchfleet-system")
    assert not any(env["name"] == "STITCHFLEET_DB_URL" for env in _operator(rendered)["env"])


def test_the_bundled_postgresql_url_carries_sslmode(full_render: Rendered) -> None:
    assert _env(_operator(full_render), "STITCHFLEET_DB_URL")["value"].endswith("/stitchfleet?sslmode=prefer")
    values = {"postgresql": {"enabled": True, "sslmode": "require", "password": "chosen"}}
    strict = render_chart(values, "stitchfleet", "stitchfleet-system")
    assert _secret_data(strict.one("Secret", "stitchfleet-db"))["url"].endswith("?sslmode=require")


def test_network_policies_open_the_webhook_and_close_metrics_and_postgresql(full_render: Rendered) -> None:
    operator = full_render.one("NetworkPolicy", "fleet-ops")
    assert operator["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    [open_rule] = operator["spec"]["ingress"]
    assert {port["port"] for port in open_rule["ports"]} == {8443, 8080}  # metrics (9090): nobody by default
    assert "from" not in open_rule
    database = full_render.one("NetworkPolicy", "fleet-ops-postgresql")
    [rule] = database["spec"]["ingress"]
    components = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]}
    assert components == {"operator", "report"} and rule["ports"] == [{"port": 5432, "protocol": "TCP"}]
    scrape = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    allowed = render_chart({"networkPolicy": {"metricsFrom": scrape}}, "stitchfleet", "stitchfleet-system")
    metrics_rule = allowed.one("NetworkPolicy", "stitchfleet")["spec"]["ingress"][1]
    assert metrics_rule == {"from": scrape, "ports": [{"port": 9090, "protocol": "TCP"}]}


def test_a_generated_password_renders_the_same_every_time_and_is_made_once_in_the_cluster(
    full_render: Rendered,
) -> None:
    # Before: `lookup` (empty under `helm template`, Argo CD, Flux) gave a new random password per render.
    again = render_chart(*VALUE_SETS["full"])
    assert again.manifests == full_render.manifests
    templates = CHART_DIR / "templates"
    assert not [path.name for path in templates.iterdir() if re.search(r"\blookup\s+\"", path.read_text())]
    deployment = full_render.one("Deployment")["spec"]["template"]["spec"]
    (init,) = deployment["initContainers"]
    name = full_render.one("StatefulSet")["metadata"]["name"]
    assert init["command"] == ["stitchfleet", "operator", "password-secret", name]
    assert init["image"] == _operator(full_render)["image"]
    assert _env(init, "STITCHFLEET_OPERATOR_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert init["securityContext"] == _operator(full_render)["securityContext"]
    # Creating is all it needs (an existing Secret answers 409 and is kept): no read of any Secret.
    secret_rules = [rule for rule in full_render.one("Role")["rules"] if "secrets" in rule["resources"]]
    assert [rule["verbs"] for rule in secret_rules] == [["create"]]  # cert-manager mode: no self-signed Secret
    for values in ({"postgresql": {"enabled": True, "password": "chosen"}}, {}):
        assert "initContainers" not in render_chart(values, "sf", "ops").one("Deployment")["spec"]["template"]["spec"]


def test_an_existing_password_secret_makes_the_chart_generate_nothing() -> None:
    values = {"postgresql": {"enabled": True, "existingSecret": "pg-password", "sslmode": "disable"}}
    rendered = render_chart(values, "sf", "ops")
    assert rendered.of_kind("Secret") == []  # nothing generated: `helm template` renders the same twice
    assert render_chart(values, "sf", "ops").manifests == rendered.manifests
    postgres = rendered.one("StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    assert _env(postgres, "POSTGRES_PASSWORD")["valueFrom"]["secretKeyRef"] == {
        "name": "pg-password",
        "key": "password",
    }
    (report,) = rendered.one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    for container in (_operator(rendered), report):
        names = [env["name"] for env in container["env"]]
        assert names.index("PGPASSWORD") < names.index("STITCHFLEET_DB_URL")  # $(PGPASSWORD) expands
        assert _env(container, "PGPASSWORD")["valueFrom"]["secretKeyRef"] == {"name": "pg-password", "key": "password"}
        url = _env(container, "STITCHFLEET_DB_URL")["value"]
        assert (
            url
            == "postgresql+psycopg://stitchfleet:$(PGPASSWORD)@sf-stitchfleet-postgresql.ops.svc.cluster.local:5432/stitchfleet?sslmode=disable"
        )
