"""An immutable, hashable attribute mapping for IR nodes and graph metadata.

Input: any mapping of str to JSON-like values (lists become tuples). Output: `Attrs`,
a read-only Mapping with a stable order (sorted keys), so equal attribute sets are
equal, hash alike and print alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeAlias

AttrValue: TypeAlias = int | float | str | bool | tuple["AttrValue", ...] | None


def freeze_value(value: object, where: str = "attribute") -> AttrValue:
    """Turns lists into tuples recursively; rejects what JSON cannot hold."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return tuple(freeze_value(item, where) for item in value)
    # numpy scalars behave like Python numbers once converted
    item = getattr(value, "item", None)
    if callable(item):
        return freeze_value(item(), where)
    raise TypeError(f"{where}: value {value!r} of type {type(value).__name__} is not a number, string, bool or list")


def thaw_value(value: AttrValue) -> object:
    """The JSON form of a value: tuples become lists."""
    if isinstance(value, tuple):
        return [thaw_value(item) for item in value]
    return value


class Attrs(Mapping[str, AttrValue]):
    """Read-only attributes; build with Attrs({...}) or Attrs(key=value)."""

    __slots__ = ("_items",)

    def __init__(self, data: Mapping[str, object] | None = None, **kwargs: object) -> None:
        merged = {**(data or {}), **kwargs}
        for key in merged:
            if not isinstance(key, str):
                raise TypeError(f"attribute name {key!r} is not a string")
        self._items: tuple[tuple[str, AttrValue], ...] = tuple(
            (key, freeze_value(merged[key], f"attribute {key!r}")) for key in sorted(merged)
        )

    def __getitem__(self, key: str) -> AttrValue:
        for name, value in self._items:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"Attrs({dict(self._items)!r})"

    def to_json(self) -> dict[str, object]:
        return {name: thaw_value(value) for name, value in self._items}

    def get_ints(self, key: str) -> tuple[int, ...]:
        """A tuple-of-int attribute; raises ValueError naming the key when it is not one."""
        value = self.get(key)
        if not isinstance(value, tuple) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"attribute {key!r} must be a list of integers, got {value!r}")
        return tuple(int(v) for v in value)  # type: ignore[arg-type]

    def get_int(self, key: str) -> int:
        value = self.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"attribute {key!r} must be an integer, got {value!r}")
        return value

    def get_str(self, key: str, default: str | None = None) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise ValueError(f"attribute {key!r} must be a string, got {value!r}")
        return value


EMPTY = Attrs()
