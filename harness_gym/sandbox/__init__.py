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

from ..plugins import load_plugin, plugin_names
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
    return plugin_names(ENTRY_POINT_GROUP)


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
    return load_plugin(
        ENTRY_POINT_GROUP, spec, SandboxBackend, noun="sandbox backend", error=SandboxError
    )
