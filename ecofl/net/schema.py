"""Typed messages: one frozen dataclass per message, JSON on the wire, validated on receipt.

A message class names its wire type (``@message("round")``). :func:`encode`
gives the JSON header (``{"type": name, **fields}``); a :class:`MessageSet`
turns a received header back into its class, checking every field against
its annotation: an ``int`` is an int (not a bool), a ``float`` is finite, a
``list[int]`` holds ints, a nested dataclass is an object of its fields,
nothing required is missing and nothing unknown is added; a field annotated
``Annotated[int, Within(0, 99)]`` or ``Annotated[str, Matches("[0-9a-f]{64}")]``
is range- or pattern-checked too (what a peer that has not proved anything
may claim). Anything else is a :class:`MalformedMessage` that names the message
type and the field, so a peer's bad message is a clear error at the door,
never a ``KeyError`` deep in a handler. Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from typing import Annotated, Any, Callable, ClassVar, TypeVar, Union

#: A JSON object whose fields the receiver reads itself (e.g. a model spec, checked by its own parser).
JsonObject = dict[str, Any]

M = TypeVar("M")


class MalformedMessage(ValueError):
    """A received message that does not match its definition (the message type and field are named)."""


@dataclasses.dataclass(frozen=True)
class Within:
    """``Annotated[int, Within(low, high)]``: a number from ``low`` to ``high``, both included."""

    low: float
    high: float

    def check(self, value: Any, where: str) -> None:
        if not self.low <= value <= self.high:
            raise MalformedMessage(f"{where}: {_kind(value)} is not within [{self.low}, {self.high}]")


@dataclasses.dataclass(frozen=True)
class Matches:
    """``Annotated[str, Matches(pattern)]``: a string the regular expression matches whole."""

    pattern: str

    def check(self, value: Any, where: str) -> None:
        if re.fullmatch(self.pattern, value) is None:
            raise MalformedMessage(f"{where}: {_kind(value)} does not match {self.pattern!r}")


def message(wire_type: str) -> Callable[[type[M]], type[M]]:
    """Class decorator: a frozen dataclass that travels as ``{"type": wire_type, **fields}``."""

    def define(cls: type[M]) -> type[M]:
        cls = dataclasses.dataclass(frozen=True)(cls)
        cls.TYPE = wire_type  # type: ignore[attr-defined]
        return cls

    return define


class Message:
    """Base of every typed message (for type hints; the wire type is ``TYPE``)."""

    TYPE: ClassVar[str]


def encode(msg: Any) -> dict[str, Any]:
    """The JSON header of ``msg`` (a nested dataclass becomes an object)."""
    return {"type": msg.TYPE, **_plain_fields(msg)}


class MessageSet:
    """The messages one side of a protocol accepts, by wire type."""

    def __init__(self, *classes: type):
        self.by_type = {cls.TYPE: cls for cls in classes}

    def decode(self, header: Any) -> Any:
        """The message ``header`` holds; :class:`MalformedMessage` if it is not one of this set, well formed."""
        if not isinstance(header, dict):
            raise MalformedMessage(f"a message must be a JSON object, got {type(header).__name__}")
        wire_type = header.get("type")
        cls = self.by_type.get(wire_type) if isinstance(wire_type, str) else None
        if cls is None:
            raise MalformedMessage(f"unknown message type {wire_type!r} (expected one of {sorted(self.by_type)})")
        return _decode_fields(cls, {k: v for k, v in header.items() if k != "type"}, wire_type)


def _plain_fields(obj: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _plain(value: Any) -> Any:
    return _plain_fields(value) if dataclasses.is_dataclass(value) else value


@functools.cache
def _schema(cls: type) -> tuple[tuple[dataclasses.Field, ...], dict[str, Any]]:
    return dataclasses.fields(cls), typing.get_type_hints(cls, include_extras=True)


def _decode_fields(cls: type, values: dict[str, Any], where: str) -> Any:
    """An instance of dataclass ``cls`` from ``values``, every field checked against its annotation."""
    fields, hints = _schema(cls)
    extra = sorted(set(values) - {f.name for f in fields})
    if extra:
        raise MalformedMessage(f"{where}: unknown field(s) {', '.join(map(str, extra))}")
    checked_values = {}
    for f in fields:
        if f.name not in values:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise MalformedMessage(f"{where}: missing field {f.name!r}")
            continue
        checked_values[f.name] = checked(values[f.name], hints[f.name], f"{where}.{f.name}")
    try:
        return cls(**checked_values)
    except (TypeError, ValueError) as error:  # the class's own checks (__post_init__) refuse the values
        raise MalformedMessage(f"{where}: {error}") from None


def checked(value: Any, annotation: Any, where: str) -> Any:
    """``value`` if it is of type ``annotation`` (JSON's view: a list for a list or a tuple), else
    :class:`MalformedMessage` naming ``where``; an int is accepted (and converted) where a float is expected."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if origin is Annotated:
        base, *constraints = typing.get_args(annotation)
        value = checked(value, base, where)
        for constraint in constraints:
            constraint.check(value, where)
        return value
    if annotation is type(None) or annotation is None:
        if value is not None:
            raise MalformedMessage(f"{where}: expected null, got {_kind(value)}")
        return None
    if origin in (Union, types.UnionType):
        present = [option for option in typing.get_args(annotation) if option is not type(None)]
        if value is not None and len(present) == 1:  # an optional field that is there: its own errors, by field
            return checked(value, present[0], where)
        for option in typing.get_args(annotation):
            try:
                return checked(value, option, where)
            except MalformedMessage:
                continue
        raise MalformedMessage(f"{where}: expected {_name(annotation)}, got {_kind(value)}")
    if annotation is bool:
        if not isinstance(value, bool):
            raise MalformedMessage(f"{where}: expected a boolean, got {_kind(value)}")
        return value
    if annotation is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise MalformedMessage(f"{where}: expected an integer, got {_kind(value)}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise MalformedMessage(f"{where}: expected a finite number, got {_kind(value)}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise MalformedMessage(f"{where}: expected a string, got {_kind(value)}")
        return value
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise MalformedMessage(f"{where}: expected an object, got {_kind(value)}")
        return _decode_fields(annotation, value, where)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise MalformedMessage(f"{where}: expected a list, got {_kind(value)}")
        (item,) = typing.get_args(annotation) or (Any,)
        return [checked(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        items = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)):
            raise MalformedMessage(f"{where}: expected a list, got {_kind(value)}")
        if len(items) == 2 and items[1] is Ellipsis:
            items = (items[0],) * len(value)
        if len(value) != len(items):
            raise MalformedMessage(f"{where}: expected {len(items)} items, got {len(value)}")
        return tuple(checked(v, item, f"{where}[{i}]") for i, (v, item) in enumerate(zip(value, items)))
    if origin is dict:
        if not isinstance(value, dict):
            raise MalformedMessage(f"{where}: expected an object, got {_kind(value)}")
        _, item = typing.get_args(annotation) or (str, Any)
        return {k: checked(v, item, f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"{where}: annotation {annotation!r} is not a JSON type")


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation)
