"""Plugins by entry point: engines, harnesses, sandboxes and task suites are all found the same
way, so a third-party package adds any of them with nothing but an entry point.

A name is checked (`check_plugin_name`) without loading anything, so a typo is reported where the
name is given, with the nearest installed names, and heavy plugins (a model engine) load only when
used.
"""

from __future__ import annotations

import difflib
from importlib.metadata import EntryPoint, entry_points
from typing import Any


def plugin_names(group: str) -> list[str]:
    return sorted({ep.name for ep in entry_points(group=group)})


def did_you_mean(name: str, choices: list[str]) -> str:
    """` (did you mean 'x'?)` for the nearest of `choices`, or "" when none is near."""
    near = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


def check_plugin_name(group: str, name: str, *, noun: str, error: type[Exception]) -> EntryPoint:
    """The entry point registered as `name` in `group`, not loaded. An unknown name raises
    `error` naming the installed ones and the nearest match."""
    found = entry_points(group=group, name=name)
    if not found:
        names = plugin_names(group)
        raise error(
            f"unknown {noun} {name!r}{did_you_mean(name, names)}; installed: "
            f"{', '.join(names) or 'none'} (found as entry points in the group {group!r}; "
            "is harness-gym installed, e.g. `pip install -e .`?)"
        )
    return next(iter(found))


def load_plugin(
    group: str, name: str, kind: type, *args: Any, noun: str, error: type[Exception]
) -> Any:
    """Call the factory registered as `name` in `group` with `args`; the result must be a
    `kind`. Unknown names and wrong results raise `error` saying what is installed."""
    made = check_plugin_name(group, name, noun=noun, error=error).load()(*args)
    if not isinstance(made, kind):
        raise error(f"entry point {name!r} in {group!r} made {made!r}, not a {kind.__name__}")
    return made
