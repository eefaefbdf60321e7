"""Module-scoped fixtures of the chart tests: one render per values set, one loaded chart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
from chart_render import CHART_DIR, VALUE_SETS, Rendered, rendered_set


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    """Every values set, each rendered once."""
    return rendered_set(request.param)


@pytest.fixture(scope="module")
def default_render() -> Rendered:
    return rendered_set("default")


@pytest.fixture(scope="module")
def full_render() -> Rendered:
    return rendered_set("full")


@pytest.fixture(scope="module")
def external_db_render() -> Rendered:
    return rendered_set("external-db")


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded
