"""Sandbox backends: where a rollout's repo lives and its commands run.

Backends are plugins in the entry-point group `harness_gym.sandboxes`; the built-in `local`
is registered there too (setup.cfg), so a third-party backend needs nothing but an entry point.

`default_sandbox()` picks the most isolating backend that works here, and never `local`:

>>> from harness_gym.sandbox import SandboxSpec, default_sandbox, load_sandbox
>>> backend = load_sandbox(default_sandbox())
>>> with backend.create(SandboxSpec()) as box:
...     box.exec("echo hi").stdout
'hi\\n'
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..plugins import load_plugin, plugin_names
from .base import (
    ExecResult,
    Job,
    Sandbox,
    SandboxBackend,
    SandboxCaps,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
)
from .local import UnisolatedSandboxWarning

ENTRY_POINT_GROUP = "harness_gym.sandboxes"

# The backend classes, for settings a name cannot carry (`BwrapSandboxBackend(network="host")`):
# imported on first use, since the remote ones pull in their SDKs.
_BACKENDS = {
    "LocalSandboxBackend": ".local",
    "BwrapSandboxBackend": ".bwrap",
    "DockerSandboxBackend": ".docker",
    "E2BSandboxBackend": ".e2b",
    "HFSandboxBackend": ".hf",
}

__all__ = [
    "BwrapSandboxBackend",
    "DockerSandboxBackend",
    "E2BSandboxBackend",
    "ENTRY_POINT_GROUP",
    "HFSandboxBackend",
    "LocalSandboxBackend",
    "ExecResult",
    "Job",
    "Sandbox",
    "SandboxBackend",
    "SandboxCaps",
    "SandboxError",
    "SandboxLimits",
    "SandboxSpec",
    "UnisolatedSandboxWarning",
    "available_sandboxes",
    "default_sandbox",
    "load_sandbox",
]


def __getattr__(name: str) -> Any:
    if name in _BACKENDS:
        return getattr(import_module(_BACKENDS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_sandboxes() -> list[str]:
    """Names of the installed sandbox backends."""
    return plugin_names(ENTRY_POINT_GROUP)


def default_sandbox() -> str:
    """The isolating backend that works here: `"bwrap"` where bubblewrap can make namespaces
    (network included), else `"docker"` where a daemon answers and has the default image.

    Never `"local"`: it does not isolate the agent from the host (the grader's interpreter, host
    services, processes left behind), so a policy trained with it learns to exploit that. Where
    neither works this raises a `SandboxError` that says how to get one, or to pass
    `sandbox="local"` explicitly to debug without isolation.
    """
    # Imported here: the probes run once, on first use, not on every import.
    from .bwrap import bwrap_available
    from .docker import docker_unavailable

    if bwrap_available():
        return "bwrap"
    why_not_docker = docker_unavailable()
    if why_not_docker is None:
        return "docker"
    raise SandboxError(
        "no isolating sandbox works here: bubblewrap cannot make namespaces (install it with "
        "`apt-get install bubblewrap`, on a host or VM that allows user namespaces) and "
        f"docker is not ready ({why_not_docker}). To run without isolation, for debugging "
        'only, pass sandbox="local".'
    )


def load_sandbox(spec: str | SandboxBackend) -> SandboxBackend:
    """A backend by entry-point name (`"local"`), or the given backend object unchanged."""
    if isinstance(spec, SandboxBackend):
        return spec
    return load_plugin(
        ENTRY_POINT_GROUP, spec, SandboxBackend, noun="sandbox backend", error=SandboxError
    )
