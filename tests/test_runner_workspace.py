"""A node runner's workspace: what a runner leaves behind is reaped when it dies, however it dies.

Real processes throughout: a "runner" is a child Python process that claims a workspace and
starts processes the way an episode does (one in its own session with TMPDIR inside the
workspace, as Pi's tool calls are; one whose working directory is inside), then dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness_gym.scaleout.runner_workspace import OWNER_FILE, Owner, RunnerWorkspace, reap_stale

RUNNER = textwrap.dedent("""
    import json, os, signal, subprocess, sys, tempfile
    from pathlib import Path
    from harness_gym.scaleout.runner_workspace import RunnerWorkspace
    workspace = RunnerWorkspace.claim(sys.argv[2], Path(sys.argv[1]))
    sandbox = tempfile.mkdtemp(prefix="harness-gym-")  # lands in the workspace
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    setsid = subprocess.Popen(["setsid", "-f", "sleep", "600"],
                              env={**os.environ, "TMPDIR": sandbox}, **quiet)
    setsid.wait()
    in_dir = subprocess.Popen(["sleep", "600"], cwd=sandbox, start_new_session=True,
                              env={"PATH": os.environ["PATH"]}, **quiet)
    print(json.dumps({"path": str(workspace.path), "guard": workspace.guard_pid,
                      "sandbox": sandbox}), flush=True)
    how = sys.argv[3]
    if how == "release":
        workspace.release()
    elif how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
""")


def sleepers_in(path: Path) -> set[int]:
    """Live `sleep 600` processes whose environment or working directory is under `path`."""
    found = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "cmdline").read_bytes() != b"sleep\x00600\x00":
                continue
            cwd = os.readlink(proc / "cwd")
            env = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (cwd.startswith(str(path)) or str(path).encode() in env):
            found.add(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_runner(base: Path, runner_id: str, how: str) -> dict:
    done = subprocess.run([sys.executable, "-c", RUNNER, str(base), runner_id, how],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout, done.stderr
    return json.loads(done.stdout.splitlines()[0])


def wait_until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize("how", ["sigkill", "sigterm", "exit"])
def test_a_dead_runners_guard_kills_its_processes_and_removes_its_dir(tmp_path, how):
    runner = run_runner(tmp_path, "runner-1", how)
    path = Path(runner["path"])
    assert wait_until(lambda: not path.exists() and not sleepers_in(path)), sleepers_in(path)
    assert wait_until(lambda: not alive(runner["guard"]))


def test_release_removes_the_workspace_and_stops_the_guard(tmp_path):
    runner = run_runner(tmp_path, "runner-1", "release")
    path = Path(runner["path"])
    assert not path.exists() and not sleepers_in(path)
    assert wait_until(lambda: not alive(runner["guard"]), timeout=5)


def test_a_new_runner_reaps_workspaces_whose_owner_is_gone(tmp_path):
    # A runner whose guard was killed too (a reboot, an OOM kill of both): its dir and its
    # processes stay until the next runner on the node starts.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / "runner-old"
    stale.mkdir()
    owner = Owner.current()
    (stale / OWNER_FILE).write_text(json.dumps({**owner.__dict__, "pid": int(dead)}))
    orphan = subprocess.Popen(["sleep", "600"], cwd=stale, start_new_session=True)
    live = tmp_path / "runner-live"  # a live owner (this process): never touched
    live.mkdir()
    (live / OWNER_FILE).write_text(json.dumps(owner.__dict__))
    neighbour = subprocess.Popen(["sleep", "600"], cwd=live, start_new_session=True)
    try:
        workspace = RunnerWorkspace.claim("runner-new", tmp_path)
        try:
            assert not stale.exists()
            assert orphan.wait(timeout=10) == -signal.SIGKILL
            assert live.exists() and neighbour.poll() is None
            assert workspace.path.exists()
        finally:
            workspace.release()
    finally:
        for proc in (orphan, neighbour):
            proc.kill()
            proc.wait()


def test_a_workspace_whose_name_extends_another_is_not_its_child(tmp_path):
    # runner-1's reaping must not take runner-10's processes (a prefix, not a parent)
    other = tmp_path / "runner-10"
    other.mkdir()
    (other / OWNER_FILE).write_text(json.dumps(Owner.current().__dict__))
    neighbour = subprocess.Popen(["sleep", "600"], cwd=other, start_new_session=True)
    try:
        workspace = RunnerWorkspace.claim("runner-1", tmp_path)
        workspace.release()
        assert neighbour.poll() is None and other.exists()
    finally:
        neighbour.kill()
        neighbour.wait()


def test_an_unclaimed_new_dir_is_left_for_its_runner(tmp_path):
    (tmp_path / "runner-starting").mkdir()  # a runner between mkdir and writing its owner file
    assert reap_stale(tmp_path) == []
    assert (tmp_path / "runner-starting").exists()


def test_the_runner_process_sends_its_temp_files_into_the_workspace(tmp_path):
    import tempfile

    workspace = RunnerWorkspace.claim("runner-1", tmp_path)
    try:
        made = Path(tempfile.mkdtemp(prefix="harness-gym-repos-"))
        assert made.parent == workspace.path
        assert os.environ["TMPDIR"] == str(workspace.path)
    finally:
        workspace.release()
    assert not workspace.path.exists()
    assert Path(tempfile.gettempdir()) != workspace.path
