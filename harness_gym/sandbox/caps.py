"""The env's check that a rollout cannot take the machine with it: before any episode runs, the
backend's sandboxes must have their processes, memory and disk capped (`SandboxBackend.caps()`,
measured on this host).

Where a cap cannot be had the env refuses to start, naming the cap and how to get it, unless the
caller opted out (`EpisodeConfig.allow_uncapped=True`): then one loud warning line says what is
uncapped, and the episodes run.
"""

from __future__ import annotations

import logging

from .base import CAP_NAMES, SandboxBackend, SandboxError, SandboxLimits

log = logging.getLogger("harness_gym.sandbox")


class UncappedSandboxError(SandboxError):
    """A sandbox cap this env needs cannot be had on this host (the message says how to get it)."""


def require_caps(
    backend: SandboxBackend, limits: SandboxLimits | None = None, *, allow_uncapped: bool = False
) -> None:
    """Apply `limits` (None: the backend's own defaults), then check every cap holds."""
    if limits is not None:
        backend.set_limits(limits)
    caps = backend.caps()
    if caps is None:
        log.warning("sandbox backend %r does not say how it caps processes, memory and disk",
                    backend.name)  # fmt: skip
        return
    missing = caps.missing()
    if not missing:
        return
    said = "; ".join(f"{name}: {caps.fixes.get(name, 'no mechanism here')}" for name in missing)
    if allow_uncapped:
        log.warning("UNCAPPED SANDBOXES (allow_uncapped=True): the %r backend cannot cap %s "
                    "here; one rollout can exhaust this machine. %s", backend.name,
                    " and ".join(missing), said)  # fmt: skip
        return
    raise UncappedSandboxError(
        f"the {backend.name!r} sandbox cannot cap {' and '.join(missing)} here: {said}. "
        "Pass allow_uncapped=True to run anyway (not for training)."
    )


__all__ = ["CAP_NAMES", "UncappedSandboxError", "require_caps"]
