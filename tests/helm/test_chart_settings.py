"""The chart's settings ConfigMap is exactly what stitchfleet.settings accepts (strict: no unknown names)."""

from __future__ import annotations

import pytest
from chart_render import VALUE_SETS, rendered_set

from stitchfleet import settings


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_settings_configmap_parses_strictly(name: str) -> None:
    rendered = rendered_set(name)
    (configmap,) = [doc for doc in rendered.of_kind("ConfigMap") if doc["metadata"]["name"].endswith("-settings")]
    data = dict(configmap["data"])
    parsed = settings.load(data, strict=True)
    assert parsed.webhook_port == 8443 and parsed.health_port == 8080
    assert parsed.webhook_self_signed is (not rendered.values.get("certManager", {}).get("enabled", False))
    assert parsed.cluster == rendered.values.get("clusterName", parsed.cluster)
