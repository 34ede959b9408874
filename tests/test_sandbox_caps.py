"""Every rollout's processes, memory and disk are capped on `local` and `bwrap`, for root (a
cgroup) and for a non-root user (rlimits in a user namespace of each command's own), and an env
refuses to start where a cap cannot be had (unless told to run uncapped, loudly).

Bounded: the caps are set low (64 processes, 512 MiB, 64 MiB on disk) and each attack asks for
a few times that, never more (300 forks, 1 GiB, 128 MiB).
"""

from __future__ import annotations

import logging

import pytest

from harness_gym.sandbox import caps as caps_module
from harness_gym.sandbox import local as local_module
from harness_gym.sandbox.bwrap import BwrapSandboxBackend, bwrap_available
from harness_gym.sandbox.base import SandboxLimits, SandboxSpec
from harness_gym.sandbox.caps import UncappedSandboxError, require_caps
from harness_gym.sandbox.local import LocalSandboxBackend
from support.as_user import why_not
from support.caps_probe import run_probe


def _measure(as_user: bool) -> dict:
    """The probe `benchmarks/caps_matrix.py` renders the doc's table from, on local and bwrap."""
    measured = run_probe("local,bwrap", as_user=as_user, timeout=300)
    if "unavailable" in measured:
        pytest.skip(measured["unavailable"])
    return measured


@pytest.mark.parametrize("user", ["root", "non-root"])
def test_processes_memory_and_disk_are_capped_on_local_and_bwrap(user: str) -> None:
    if user == "root" and why_not() == "needs root to create a throwaway user":
        pytest.skip("this process is not root: the non-root case covers it")
    measured = _measure(as_user=user == "non-root")
    assert (measured["uid"] == 0) == (user == "root")
    for name in ("local", "bwrap"):
        got = measured[name]
        if "unavailable" in got:
            continue  # bwrap cannot run here
        assert got["leftovers_at_start"] == 0, got  # the last backend's sandboxes are gone
        assert got["missing"] == [], got
        assert got["pids_limited"] and got["memory_limited"] in ("sandbox", "process"), got
        assert got["forked"] < 64, got  # 300 asked for
        assert "1073741824" not in " ".join(got["memory"]), got  # MemoryError, or killed
        assert got["disk"][0] != "rc=0", got  # RLIMIT_FSIZE: File too large
        assert int(got["disk"][-1]) <= 64 * 2**20, got
        assert got["escapee"]["started"] >= 1 and got["escapee"]["left_after_kill"] == 0, got
        # A fork bomb's turn ends at the full cap, with the reason, well before the timeout.
        assert got["bomb"]["ended_s"] is not None and got["bomb"]["ended_s"] < 45, got
        assert "process cap of 64" in (got["bomb"]["fault"] or ""), got
        assert got["bomb"]["burst_fault"] is None, got  # at the cap for 2 s, then it drains
        if user == "root":
            assert got["caps"]["pids"].startswith("cgroup"), got
        else:
            assert got["caps"]["pids"].startswith("RLIMIT_NPROC"), got
            assert got["memory_limited"] == "process", got


def _no_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host as a container without a writable cgroupfs would be."""
    monkeypatch.setattr(local_module, "cgroup_parent", lambda: None)
    monkeypatch.setattr(local_module, "memory_parent", lambda: None)


def test_root_without_a_cgroup_has_no_process_cap_and_the_env_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if why_not() == "needs root to create a throwaway user":
        pytest.skip("RLIMIT_NPROC holds for a non-root user: nothing is missing")
    if not bwrap_available():
        pytest.skip("bubblewrap cannot run here")
    _no_cgroups(monkeypatch)
    for backend in (BwrapSandboxBackend(), LocalSandboxBackend()):
        caps = backend.caps()
        assert caps.missing() == ["pids"], caps  # root is exempt from RLIMIT_NPROC (measured)
        assert caps.memory.startswith("RLIMIT_DATA"), caps
        with pytest.raises(UncappedSandboxError) as refused:
            require_caps(backend, SandboxLimits(pids=64))
        said = str(refused.value)
        assert f"{backend.name!r} sandbox cannot cap pids" in said
        assert "/sys/fs/cgroup" in said and "allow_uncapped=True" in said
        backend.close()


def test_allow_uncapped_runs_with_one_loud_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if why_not() == "needs root to create a throwaway user":
        pytest.skip("RLIMIT_NPROC holds for a non-root user: nothing is missing")
    _no_cgroups(monkeypatch)
    backend = LocalSandboxBackend()
    with caplog.at_level(logging.WARNING, logger=caps_module.log.name):
        require_caps(backend, None, allow_uncapped=True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("UNCAPPED SANDBOXES"), lines
    backend.close()


def test_an_env_with_an_uncapped_backend_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the public path: `make(...)` then the first `reset()` builds the stack."""
    if why_not() == "needs root to create a throwaway user":
        pytest.skip("RLIMIT_NPROC holds for a non-root user: nothing is missing")
    import gymnasium

    import harness_gym  # noqa: F401  (registers the env)

    _no_cgroups(monkeypatch)
    env = gymnasium.make("HarnessSWE-v0", harness="pi", engine="oracle", sandbox="local",
                         progress=False)  # fmt: skip
    try:
        with pytest.raises(UncappedSandboxError, match="cannot cap pids"):
            env.reset(seed=0)
    finally:
        env.close()


def test_a_fork_bomb_in_a_container_ends_its_turn_at_the_pids_limit_with_the_reason() -> None:
    """Docker's pids_limit holds the bomb (bounded: 64); the container's count held there ends
    the agent's turn (`sandbox/_pids.py`) instead of leaving the CLI to wait for the timeout."""
    from harness_gym.sandbox.docker import DockerSandboxBackend, docker_unavailable

    if why := docker_unavailable():
        pytest.skip(why)
    backend = DockerSandboxBackend()
    backend.set_limits(SandboxLimits(pids=64, memory_bytes=512 * 2**20, disk_bytes=64 * 2**20))
    try:
        with backend.create(SandboxSpec()) as box:
            job = box.start("bash -c 'b() { b | b & }; b' >/dev/null 2>&1 </dev/null; sleep 1000")
            result = job.wait(timeout=60)
            assert not result.timed_out
            assert "process cap of 64" in (box.fault or ""), box.fault
            box.kill_processes()
            assert box.exec("echo alive").stdout.strip() == "alive"  # usable again after
    finally:
        backend.close()
