"""Test-only: make a CLI's recorded requests comparable across runs (fixtures in tests/fixtures).

`portable` replaces this run's paths, port and volatile values with placeholders; `chat_shape`
keeps what the proxy depends on in an OpenAI Chat request (fields, roles, content types, tool
names), not the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any


def portable(
    request: Any, literals: Mapping[str, str], patterns: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    text = json.dumps({"method": request.method, "path": request.path,
                       "headers": request.headers, "body": request.body})
    for value, placeholder in literals.items():
        text = text.replace(value, placeholder)
    for pattern, placeholder in (*patterns, (r"127\.0\.0\.1:\d+", "127.0.0.1:<port>")):
        text = re.sub(pattern, placeholder, text)
    return json.loads(text)


def chat_shape(requests: list[dict[str, Any]]) -> list[Any]:
    return [
        {
            "path": r["path"],
            "headers": sorted(k.lower() for k in r["headers"]),
            "fields": sorted(r["body"]),
            "messages": [(m["role"], sorted(m), type(m.get("content")).__name__)
                         for m in r["body"]["messages"]],
            "tools": [t["function"]["name"] for t in r["body"]["tools"]],
        }
        for r in requests
    ]
