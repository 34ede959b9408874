from __future__ import annotations


class Config:
    """Sections of string values; section and key names are case-sensitive."""

    def __init__(self) -> None:
        self.sections: dict[str, dict[str, str]] = {}

    def add_section(self, name: str) -> dict[str, str]:
        return self.sections.setdefault(name, {})

    def get(self, section: str, key: str, default: str | None = None) -> str | None:
        return self.sections.get(section, {}).get(key, default)

    def getint(self, section: str, key: str, default: int | None = None) -> int | None:
        value = self.get(section, key)
        return default if value is None else int(value)

    def getbool(self, section: str, key: str, default: bool = False) -> bool:
        value = self.get(section, key)
        if value is None:
            return default
        return value.lower() in ("1", "true", "yes", "on")
