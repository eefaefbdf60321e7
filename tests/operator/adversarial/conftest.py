"""Fixtures of the adversarial suite: the same attack on SQLite and on PostgreSQL (a server of the suite's own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.telemetry.conftest import create_database, running_server


@pytest.fixture(scope="module")
def adversarial_pg() -> Iterator[object]:
    with running_server() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'telemetry.db'}"
    return create_database(request.getfixturevalue("adversarial_pg"))
