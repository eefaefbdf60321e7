"""What the chart's RBAC lets the operator do, checked against the API requests it really made.

A plain module (imported by the tests next to it). Input: kmock's log of requests and the
rules of the rendered chart's ClusterRole and (release-namespace) Role. Output: the requests no
rule allows, as readable lines. The matching follows Kubernetes RBAC: apiGroups, resources
(`resource/subresource` for a subresource), verbs, and resourceNames for named requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kmock

from tests.helm.chart_render import render_chart

# kmock's parsed action -> the RBAC verb; an update is `patch` or `update` by HTTP method.
VERBS = {"FETCH": "get", "LIST": "list", "WATCH": "watch", "CREATE": "create", "DELETE": "delete"}


@dataclass(frozen=True)
class ApiCall:
    """One request as RBAC sees it."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " cluster-wide"
        return f"{self.verb} {self.group or 'core'}/{self.resource}{'/' + self.name if self.name else ''}{where}"


def api_calls(api: kmock.KubernetesEmulator) -> set[ApiCall]:
    """Every resource request kmock served (discovery requests name no resource and are left out)."""
    calls = set()
    for request in list(api):
        if request.resource is None or request.resource.plural is None or request.action is None:
            continue
        action = request.action.value
        verb = VERBS.get(action) or ("update" if request.method.value == "PUT" else "patch")
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        calls.add(ApiCall(verb, request.resource.group or "", resource, request.namespace, request.name))
    return calls


def chart_rules(
    release: str, namespace: str, values: Mapping[str, Any] | None = None
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(ClusterRole rules, Role rules) of the chart rendered with `values` (default: its default values)."""
    rendered = render_chart(dict(values or {}), release, namespace)
    cluster_role, role = rendered.one("ClusterRole"), rendered.one("Role")
    return cluster_role["rules"], role["rules"]


def _allows(rule: Mapping[str, Any], call: ApiCall) -> bool:
    names = rule.get("resourceNames") or []
    return (
        call.group in rule.get("apiGroups", [])
        and call.resource in rule.get("resources", [])
        and call.verb in rule.get("verbs", [])
        and (not names or call.name in names)
    )


def denied(
    calls: Iterable[ApiCall], release: str, namespace: str, values: Mapping[str, Any] | None = None
) -> list[str]:
    """The calls neither the ClusterRole nor, in the release namespace, the Role allows."""
    cluster_rules, namespace_rules = chart_rules(release, namespace, values)
    refused = []
    for call in calls:
        rules = [*cluster_rules, *(namespace_rules if call.namespace == namespace else [])]
        if not any(_allows(rule, call) for rule in rules):
            refused.append(str(call))
    return sorted(refused)
