"""settings: typed parsing, defaults, and errors that name the variable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stitchfleet import settings


def test_defaults_without_environment() -> None:
    current = settings.load({})
    assert current.enabled is False
    assert current.backend == "auto"
    assert current.check_every == 100
    assert current.database_url.startswith("sqlite:///")
    assert current.database_url.endswith("telemetry.db")


@pytest.mark.parametrize(
    ("name", "raw", "field", "expected"),
    [
        ("STITCHFLEET_ENABLED", "1", "enabled", True),
        ("STITCHFLEET_ENABLED", "off", "enabled", False),
        ("STITCHFLEET_CHECK_EVERY", " 25 ", "check_every", 25),
        ("STITCHFLEET_SLOWDOWN_MARGIN", "0.1", "slowdown_margin", 0.1),
        ("STITCHFLEET_BACKEND", "sim", "backend", "sim"),
        ("STITCHFLEET_STATE_DIR", "/tmp/sf", "state_dir", Path("/tmp/sf")),
        ("STITCHFLEET_DB_URL", "postgresql+psycopg://db/sf", "db_url", "postgresql+psycopg://db/sf"),
    ],
)
def test_values_are_parsed_to_their_type(name: str, raw: str, field: str, expected: object) -> None:
    assert getattr(settings.load({name: raw}), field) == expected


@pytest.mark.parametrize(
    ("name", "raw", "expected_words"),
    [
        ("STITCHFLEET_CHECK_EVERY", "abc", "expected an integer"),
        ("STITCHFLEET_ENABLED", "maybe", "expected a boolean"),
        ("STITCHFLEET_SLOWDOWN_MARGIN", "5%", "expected a number"),
        ("STITCHFLEET_BACKEND", "tpu", "expected one of auto, cpu, cuda, cuda-cpu, sim"),
        ("STITCHFLEET_WORLD_SIZE", "0", "expected a value >= 1"),
    ],
)
def test_malformed_value_names_variable_and_type(name: str, raw: str, expected_words: str) -> None:
    with pytest.raises(settings.SettingsError) as caught:
        settings.load({name: raw})
    message = str(caught.value)
    assert name in message
    assert repr(raw) in message or raw.strip() in message
    assert expected_words in message


def test_strict_mode_rejects_unknown_names() -> None:
    with pytest.raises(settings.SettingsError, match="STITCHFLEET_CHECK_EVRY"):
        settings.load({"STITCHFLEET_CHECK_EVRY": "5"}, strict=True)
    assert settings.load({"STITCHFLEET_CHECK_EVRY": "5"}).check_every == 100


def test_sqlite_default_follows_state_dir() -> None:
    current = settings.load({"STITCHFLEET_STATE_DIR": "/var/lib/sf"})
    assert current.database_url == "sqlite:////var/lib/sf/telemetry.db"
    assert current.spool_dir == Path("/var/lib/sf/spool")


def test_current_is_cached_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    settings.reset()
    monkeypatch.setenv("STITCHFLEET_CHECK_EVERY", "7")
    assert settings.current().check_every == 7
    monkeypatch.setenv("STITCHFLEET_CHECK_EVERY", "9")
    assert settings.current().check_every == 7
    settings.reset()
    assert settings.current().check_every == 9
    settings.reset()


def test_every_knob_is_documented() -> None:
    rows = settings.describe()
    assert len({name for name, *_ in rows}) == len(rows)
    for name, kind, _default, doc in rows:
        assert name.startswith("STITCHFLEET_")
        assert kind
        assert doc.endswith(".")


def test_every_knob_is_in_exactly_one_area() -> None:
    names = [f.name for f in dataclasses.fields(settings.Settings)]
    listed = [name for names in settings.AREAS.values() for name in names]
    assert sorted(listed) == sorted(names), "settings.AREAS must list every knob exactly once"


def test_describe_lists_knobs_area_by_area() -> None:
    areas = [settings.area_of(name.removeprefix(settings.PREFIX).lower()) for name, *_ in settings.describe()]
    assert areas[0] == "plugin"
    # each area's knobs come together, in AREAS' order
    firsts = [a for i, a in enumerate(areas) if i == 0 or areas[i - 1] != a]
    assert firsts == list(settings.AREAS)
    with pytest.raises(KeyError, match="no area"):
        settings.area_of("no_such_knob")
