"""Typed field access for JSON request bodies, with errors that name the offending field.

Validation happens while translating into canonical types (one pass, no model objects), so a
bad body costs nothing extra and every error says which parameter is wrong and what it needs.
"""

from __future__ import annotations

from typing import Any

import orjson

from .errors import invalid

_MISSING = object()
_TYPE_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
               list: "an array", dict: "an object"}


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    return body


def field(
    obj: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    param: str,
    *,
    required: bool = False,
    default: Any = None,
) -> Any:
    """`obj[key]` checked against `kind`; None counts as absent. Booleans are not numbers."""
    value = obj.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise invalid(f"Missing required parameter: '{param}'.", param)
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and int not in kinds:
        kinds = (*kinds, int)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        expected = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds if k is not int or float not in kinds)
        raise invalid(
            f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)}.",
            param,
        )
    return value


def number_in(value: float | None, low: float, high: float, param: str) -> float | None:
    if value is not None and not low <= value <= high:
        raise invalid(f"Invalid value for '{param}': {value} is not in [{low}, {high}].", param)
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kind, name in _TYPE_NAMES.items():
        if isinstance(value, kind):
            return name
    return type(value).__name__
