"""Tool-call arguments compared as the CLIs' runtimes see them, once they have echoed them back.

The CLIs parse the model's arguments and send them back re-serialized (DESIGN, "The CLIs do not
echo the model's turn verbatim"). Pi (node), Claude Code and OpenCode (Bun) do it with
JavaScript's `JSON.parse` and `JSON.stringify`, where every number is an IEEE double: `120000.0`
comes back as `120000`, `1e5` as `100000`, `-0` as `0`, a 20-digit integer as its nearest
double's digits (`12345678901234567890` -> `12345678901234567000`), and a number too large for
a double (`1e400`, Infinity) as `null`. Hermes (Python's json) keeps them, or writes an
overflowing one as `Infinity`. A key that kept `int` and `float` apart (as Python does) did not
recognise the JavaScript echo, and the episode split into two agent segments.

`echo_key` is equal for two argument values exactly when JavaScript's round trip makes them the
same JSON: numbers are compared as the double JavaScript parses them to (so values that are
different doubles are never equated), with `-0` as `0` and a non-finite number as `null`.
Python's round trip keeps strictly more apart than JavaScript's, so Hermes' echo matches too.
Arguments the proxy could not parse (kept as the raw string) are read with Python's json, which
takes what orjson refuses (`1e400`, `Infinity`), so a raw `{"n": 1e400}` matches its echo
`{"n":null}`.

The key is built without recursion: an argument nested 1,000 deep (orjson parses up to 1,024)
must not crash the bridge.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

_DIGEST_SIZE = 16


def js_number(value: int | float) -> float | None:
    """The number JavaScript's `JSON.stringify(JSON.parse(text))` leaves for a JSON number whose
    parsed value is `value`: the nearest double (CPython's int->float and float parsing round
    correctly, as V8 and JavaScriptCore do), `-0` as `0`, None (`null`) where it is not finite."""
    try:
        number = float(value)
    except OverflowError:  # an int beyond the largest double: JSON.parse gives Infinity
        return None
    if not math.isfinite(number):
        return None
    return number + 0.0  # -0.0 + 0.0 == 0.0


def echo_key(arguments: Any) -> bytes:
    """A digest equal for two tool-call argument values exactly when a JavaScript CLI's round
    trip turns them into the same JSON (see the module docstring)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            pass  # compared as the raw text
    digest = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    stack: list[Any] = [arguments]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):  # a closing marker pushed below
            digest.update(item)
        elif isinstance(item, str):
            data = item.encode("utf-8", "surrogatepass")
            digest.update(b"s%d:" % len(data) + data)
        elif item is None or isinstance(item, bool):
            digest.update({None: b"z", True: b"t", False: b"f"}[item])
        elif isinstance(item, (int, float)):
            number = js_number(item)
            digest.update(b"z" if number is None else b"n" + number.hex().encode())
        elif isinstance(item, dict):
            digest.update(b"{")
            stack.append(b"}")
            # Last pushed is hashed first: push in reverse sorted order. A key order never
            # matters (JavaScript even moves integer-like keys first).
            for key in sorted(item, key=str, reverse=True):
                stack.append(item[key])
                stack.append(str(key))
        elif isinstance(item, (list, tuple)):
            digest.update(b"[")
            stack.append(b"]")
            stack.extend(reversed(item))
        else:
            raise TypeError(f"not a JSON value: {type(item).__name__}")
    return digest.digest()
