"""Plugins by entry point: engines, harnesses, sandboxes and task suites are all found the same
way, so a third-party package adds any of them with nothing but an entry point."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any


def plugin_names(group: str) -> list[str]:
    return sorted({ep.name for ep in entry_points(group=group)})


def load_plugin(
    group: str, name: str, kind: type, *args: Any, noun: str, error: type[Exception]
) -> Any:
    """Call the factory registered as `name` in `group` with `args`; the result must be a
    `kind`. Unknown names and wrong results raise `error` saying what is installed."""
    found = entry_points(group=group, name=name)
    if not found:
        installed = ", ".join(plugin_names(group)) or "none"
        raise error(
            f"unknown {noun} {name!r}; installed: {installed} ({noun}s are entry points in the"
            f" group {group!r}; is harness-gym installed, e.g. `pip install -e .`?)"
        )
    made = next(iter(found)).load()(*args)
    if not isinstance(made, kind):
        raise error(f"entry point {name!r} in {group!r} made {made!r}, not a {kind.__name__}")
    return made
