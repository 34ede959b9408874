"""Sandbox backends: where a rollout's repo lives and its commands run.

Backends are plugins in the entry-point group `harness_gym.sandboxes`; the built-in `local`
is registered there too (setup.cfg), so a third-party backend needs nothing but an entry point.

>>> from harness_gym.sandbox import SandboxSpec, load_sandbox
>>> backend = load_sandbox("local")
>>> with backend.create(SandboxSpec()) as box:
...     box.exec("echo hi").stdout
'hi\\n'
"""

from __future__ import annotations

from importlib.metadata import entry_points

from .base import ExecResult, Job, Sandbox, SandboxBackend, SandboxError, SandboxSpec

ENTRY_POINT_GROUP = "harness_gym.sandboxes"

__all__ = [
    "ENTRY_POINT_GROUP",
    "ExecResult",
    "Job",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxSpec",
    "available_sandboxes",
    "default_sandbox",
    "load_sandbox",
]


def available_sandboxes() -> list[str]:
    """Names of the installed sandbox backends."""
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def default_sandbox() -> str:
    """The most isolating backend that works here: `"bwrap"` where bubblewrap can make
    namespaces, `"local"` otherwise (no bubblewrap, or a container that forbids namespaces)."""
    # Imported here: bwrap probes the host once, on first use, not on every import.
    from .bwrap import bwrap_available

    return "bwrap" if bwrap_available() else "local"


def load_sandbox(spec: str | SandboxBackend) -> SandboxBackend:
    """A backend by entry-point name (`"local"`), or the given backend object unchanged."""
    if isinstance(spec, SandboxBackend):
        return spec
    found = entry_points(group=ENTRY_POINT_GROUP, name=spec)
    if not found:
        raise SandboxError(
            f"unknown sandbox backend {spec!r}; installed: {', '.join(available_sandboxes())}"
            " (a backend is an entry point in the group 'harness_gym.sandboxes';"
            " is harness-gym installed, e.g. `pip install -e .`?)"
        )
    factory = next(iter(found)).load()
    backend = factory()
    if not isinstance(backend, SandboxBackend):
        raise SandboxError(f"entry point {spec!r} made {backend!r}, not a SandboxBackend")
    return backend
