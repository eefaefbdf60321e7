"""What a row's fields may hold when they come from outside the process (a pod's JSON, a spool line).

Input: a row class and the values of its JSON object (before construction). Output: nothing, or a
`ValueError` naming the field and what it expected: strict JSON types (an integer is not a bool or a
float), integers within their database column's range, strings within their column's length and
without NUL (PostgreSQL refuses it), finite numbers. The same on SQLite and PostgreSQL, since it is
checked before either sees the row. Standard library only: a pod reads spool lines with it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
# BigInteger columns (telemetry/models.py); every other integer column is a 32-bit Integer.
BIG_INTEGERS = frozenset({"first_step", "last_step", "step"})
# Column lengths (models.py); Text columns get TEXT_LIMIT.
LENGTHS = {
    "cluster": 253,
    "namespace": 253,
    "job_name": 253,
    "job_uid": 128,
    "team": 128,
    "model": 128,
    "pod_name": 253,
    "gpu_type": 64,
    "device_kind": 8,
    "fingerprint": 64,
    "cluster_fingerprint": 64,
    "profile": 128,
    "shapes": 256,
    "uuid": 36,
    "status": 16,
    "mode": 16,
    "kind": 32,
    "verdict": 16,
    "outcome": 16,
}
TEXT_LIMIT = 16384
TIME_TEXT_LIMIT = 64


def check(cls: type[Any], values: Mapping[str, Any], where: str = "") -> None:
    """Raises ValueError naming the first field of `values` that `cls` (a row dataclass) cannot hold."""
    hints = _hints(cls)
    for name, value in values.items():
        hint = hints.get(name)
        if hint is not None:
            _check_value(f"{where or cls.__name__}.{name}", name, hint, value)


_HINTS: dict[str, dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    known = _HINTS.get(cls.__qualname__)
    if known is None:
        names = {field.name for field in dataclasses.fields(cls)}
        known = {name: hint for name, hint in typing.get_type_hints(cls).items() if name in names}
        _HINTS[cls.__qualname__] = known
    return known


def _check_value(where: str, name: str, hint: Any, value: Any) -> None:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) not in options:
            raise ValueError(f"{where}: null, expected {_describe(options)}")
        return
    kinds = [option for option in options if option is not type(None)]
    if len(kinds) != 1:
        raise ValueError(f"{where}: no rule for {hint}")
    kind = kinds[0]
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {type(value).__name__}, expected true or false")
    elif kind is int:
        _check_int(where, name, value)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{where}: {value!r}, expected a finite number")
    elif kind is str:
        _check_text(where, value, LENGTHS.get(name, TEXT_LIMIT))
    elif isinstance(kind, type) and dataclasses.is_dataclass(kind):  # the job key, as an object of strings
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {type(value).__name__}, expected an object")
        check(kind, value, where)
    else:  # a time, as ISO 8601 text
        _check_text(where, value, TIME_TEXT_LIMIT)


def _check_int(where: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {value!r} ({type(value).__name__}), expected an integer")
    low, high = INT64 if name in BIG_INTEGERS else INT32
    if not low <= value <= high:
        raise ValueError(f"{where}: {value} is outside [{low}, {high}]")


def _check_text(where: str, value: Any, limit: int) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{where}: {type(value).__name__}, expected a string")
    if len(value) > limit:
        raise ValueError(f"{where}: {len(value)} characters, at most {limit}")
    if "\x00" in value:
        raise ValueError(f"{where}: contains a NUL character")


def _describe(options: tuple[Any, ...]) -> str:
    return " or ".join(getattr(option, "__name__", str(option)) for option in options)
