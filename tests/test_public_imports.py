"""The names the README and docs tell users to import exist where they say."""

from __future__ import annotations

import pytest

import harness_gym


def test_sandbox_backends_import_from_the_sandbox_package():
    from harness_gym.sandbox import BwrapSandboxBackend, DockerSandboxBackend, SandboxBackend
    from harness_gym.sandbox.bwrap import BwrapSandboxBackend as defined

    assert BwrapSandboxBackend is defined and issubclass(DockerSandboxBackend, SandboxBackend)
    assert BwrapSandboxBackend(network="host") is not None  # the README's example builds
    with pytest.raises(ImportError, match="cannot import name 'NoSuchBackend'"):
        from harness_gym.sandbox import NoSuchBackend  # noqa: F401


def test_ray_cluster_is_a_top_level_name():
    from harness_gym.scaleout.ray_cluster import RayCluster

    assert harness_gym.RayCluster is RayCluster and "RayCluster" in harness_gym.__all__
    assert RayCluster(address="auto").address == "auto"  # a plain record: Ray is not needed


def test_every_top_level_name_resolves_and_unknown_ones_fail_clearly():
    for name in harness_gym.__all__:
        assert getattr(harness_gym, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        harness_gym.Nope  # noqa: B018
