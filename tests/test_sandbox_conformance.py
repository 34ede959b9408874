"""The shared sandbox conformance suite (tests/sandbox_conformance.py), run for each backend
whose processes live on this host."""

from __future__ import annotations

import pytest
from sandbox_conformance import SandboxConformance

from harness_gym.sandbox.bwrap import bwrap_available
from harness_gym.sandbox.docker import docker_unavailable


class TestLocal(SandboxConformance):
    backend_name = "local"
    isolates_files = False


@pytest.mark.skipif(
    not bwrap_available(),
    reason="bubblewrap is not installed or cannot make namespaces here (apt-get install bubblewrap)",
)
class TestBwrap(SandboxConformance):
    backend_name = "bwrap"
    signal_exit_codes = (137,)  # bwrap reports a signal death in the shell's 128+n encoding


_NO_DOCKER = docker_unavailable()


@pytest.mark.skipif(_NO_DOCKER is not None, reason=str(_NO_DOCKER))
class TestDocker(SandboxConformance):
    backend_name = "docker"
    signal_exit_codes = (137,)  # the wrapper's shell reports a signal death as 128+n
