"""Every rollout's processes, memory and disk are capped on `local` and `bwrap`, for root (a
cgroup) and for a non-root user (rlimits in a user namespace of each command's own), and an env
refuses to start where a cap cannot be had (unless told to run uncapped, loudly).

Bounded: the caps are set low (64 processes, 512 MiB, 64 MiB on disk) and each attack asks for
a few times that, never more (300 forks, 1 GiB, 128 MiB).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest

from harness_gym.sandbox import caps as caps_module
from harness_gym.sandbox import local as local_module
from harness_gym.sandbox.bwrap import BwrapSandboxBackend, bwrap_available
from harness_gym.sandbox.base import SandboxLimits
from harness_gym.sandbox.caps import UncappedSandboxError, require_caps
from harness_gym.sandbox.local import LocalSandboxBackend
from support.as_user import run_as_user, why_not

# Run as root here and as a throwaway user: the same measurements, printed as JSON.
MEASURE = textwrap.dedent(r"""
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    from harness_gym.sandbox.base import SandboxLimits, SandboxSpec
    from harness_gym.sandbox.bwrap import BwrapSandboxBackend, bwrap_available
    from harness_gym.sandbox.local import LocalSandboxBackend

    FORK = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(300):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(1)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n)\n"
    )
    MEMORY = "python3 -c 'b = bytearray(2**30); print(len(b))' 2>&1 | tail -1; echo rc=${PIPESTATUS[0]}"
    DISK = "head -c 134217728 /dev/zero > big 2>&1; echo rc=$?; stat -c %s big"
    limits = SandboxLimits(pids=64, memory_bytes=512 * 2**20, disk_bytes=64 * 2**20)
    out = {"uid": os.geteuid()}
    backends = {"local": LocalSandboxBackend}
    if bwrap_available():
        backends["bwrap"] = BwrapSandboxBackend
    for name, make in backends.items():
        backend = make()
        backend.set_limits(limits)
        caps = backend.caps()
        with backend.create(SandboxSpec()) as box:
            out[name] = {
                "caps": {"pids": caps.pids, "memory": caps.memory, "disk": caps.disk},
                "missing": caps.missing(),
                "pids_limited": box.pids_limited,
                "memory_limited": box.memory_limited,
                "forked": box.exec(["python3", "-c", FORK]).stdout.strip(),
                "memory": box.exec(MEMORY).stdout.strip(),
                "disk": box.exec(DISK).stdout.strip(),
            }
        backend.close()
    print(json.dumps(out))
""")


def _measure(as_user: bool) -> dict:
    if as_user:
        if why := why_not():
            pytest.skip(why)
        done = run_as_user(MEASURE)
    else:
        done = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("user", ["root", "non-root"])
def test_processes_memory_and_disk_are_capped_on_local_and_bwrap(user: str) -> None:
    if user == "root" and why_not() == "needs root to create a throwaway user":
        pytest.skip("this process is not root: the non-root case covers it")
    measured = _measure(as_user=user == "non-root")
    assert (measured["uid"] == 0) == (user == "root")
    for name in ("local", "bwrap"):
        if name not in measured:
            continue  # bwrap cannot run here
        got = measured[name]
        assert got["missing"] == [], got
        assert got["pids_limited"] and got["memory_limited"] in ("sandbox", "process"), got
        assert int(got["forked"]) < 64, got  # 300 asked for
        assert "1073741824" not in got["memory"], got  # MemoryError, or killed at the cgroup cap
        assert "rc=0" not in got["disk"].splitlines()[0], got  # RLIMIT_FSIZE: File too large
        assert int(got["disk"].splitlines()[-1]) <= 64 * 2**20, got
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
