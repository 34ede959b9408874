"""The shared sandbox conformance suite (tests/sandbox_conformance.py), run for each backend
whose processes live on this host."""

from __future__ import annotations

import warnings

import pytest
from sandbox_conformance import SandboxConformance

from harness_gym.sandbox import SandboxBackend, UnisolatedSandboxWarning
from harness_gym.sandbox._cgroups import cgroup_parent
from harness_gym.sandbox._pidns import how as pid_namespace
from harness_gym.sandbox.bwrap import BwrapSandboxBackend, bwrap_available
from harness_gym.sandbox.docker import DockerSandboxBackend, docker_unavailable
from harness_gym.sandbox.local import LocalSandboxBackend

# Where this host lets us make cgroups (root), local and bwrap cap pids and find every process.
_CGROUPS = cgroup_parent() is not None


@pytest.mark.filterwarnings("ignore::harness_gym.sandbox.UnisolatedSandboxWarning")
class TestLocal(SandboxConformance):
    backend_name = "local"
    isolates_files = False
    kills_every_escapee = _CGROUPS or pid_namespace() is not None
    caps_pids = _CGROUPS
    caps_output = True

    def limited_backend(self, pids: int) -> SandboxBackend:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnisolatedSandboxWarning)
            return LocalSandboxBackend(pids=pids)


@pytest.mark.skipif(
    not bwrap_available(),
    reason="bubblewrap is not installed or cannot make namespaces here (apt-get install bubblewrap)",
)
class TestBwrap(SandboxConformance):
    backend_name = "bwrap"
    signal_exit_codes = (137,)  # bwrap reports a signal death in the shell's 128+n encoding
    kills_every_escapee = True  # a pid namespace per command
    caps_pids = _CGROUPS
    caps_output = True
    protects_interpreter = True

    def limited_backend(self, pids: int) -> SandboxBackend:
        return BwrapSandboxBackend(pids=pids)


_NO_DOCKER = docker_unavailable()


@pytest.mark.skipif(_NO_DOCKER is not None, reason=str(_NO_DOCKER))
class TestDocker(SandboxConformance):
    backend_name = "docker"
    signal_exit_codes = (137,)  # the wrapper's shell reports a signal death as 128+n
    kills_every_escapee = True  # everything in the container but its init and sleep
    caps_pids = True
    caps_output = True
    protects_interpreter = True  # a read-only root filesystem

    def limited_backend(self, pids: int) -> SandboxBackend:
        return DockerSandboxBackend(pids=pids)
