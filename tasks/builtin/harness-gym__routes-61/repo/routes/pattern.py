from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_PLACEHOLDER = re.compile(r"<(?:(?P<converter>[a-z]+):)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)>")

# converter name -> (regex for the segment, function turning the text into a value)
CONVERTERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "str": (r"[^/]+", str),
    "int": (r"[0-9]+", int),
    "path": (r".+", str),
}


@dataclass
class CompiledPattern:
    regex: re.Pattern[str]
    converters: dict[str, Callable[[str], Any]]

    def convert(self, groups: dict[str, str]) -> dict[str, Any]:
        return {name: self.converters[name](text) for name, text in groups.items()}


def compile_pattern(template: str) -> CompiledPattern:
    """Turn '/users/<int:user_id>' into a regex with one named group per placeholder."""
    regex = ""
    converters: dict[str, Callable[[str], Any]] = {}
    position = 0
    for placeholder in _PLACEHOLDER.finditer(template):
        kind = placeholder["converter"] or "str"
        if kind not in CONVERTERS:
            raise ValueError(f"unknown converter {kind!r} in {template!r}")
        segment, to_value = CONVERTERS[kind]
        regex += re.escape(template[position : placeholder.start()])
        regex += f"(?P<{placeholder['name']}>{segment})"
        converters[placeholder["name"]] = to_value
        position = placeholder.end()
    regex += re.escape(template[position:])
    return CompiledPattern(re.compile(regex), converters)
