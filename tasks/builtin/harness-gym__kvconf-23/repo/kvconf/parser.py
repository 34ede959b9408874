from __future__ import annotations

from .config import Config
from .errors import ParseError


def _is_comment(line: str) -> bool:
    return line.startswith(("#", ";"))


def parse(text: str) -> Config:
    """Parse `[section]` headers and `key = value` lines; `#` and `;` start comment lines."""
    config = Config()
    section = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or _is_comment(line):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = config.add_section(line[1:-1].strip())
            continue
        if section is None:
            raise ParseError(number, f"{line!r} is outside of any [section]")
        if "=" not in line:
            raise ParseError(number, f"expected 'key = value', got {line!r}")
        key, value = line.split("=")
        section[key.strip()] = value.strip()
    return config
