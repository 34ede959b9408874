"""The local sandbox backend, with real processes: exit codes, timeouts that kill whole process
groups, background jobs, setsid escapees, files, isolation between sandboxes, cleanup; and that
it warns it is not isolated and is never picked for you."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import harness_gym.sandbox.bwrap as bwrap
import harness_gym.sandbox.docker as docker
from harness_gym.sandbox import (
    SandboxError,
    SandboxSpec,
    UnisolatedSandboxWarning,
    default_sandbox,
    load_sandbox,
)
from harness_gym.sandbox._pidns import how as pid_namespace
from harness_gym.sandbox._processes import SANDBOX_MARKER, marked_pids
from harness_gym.sandbox.local import LocalSandbox, LocalSandboxBackend

pytestmark = pytest.mark.filterwarnings("ignore::harness_gym.sandbox.UnisolatedSandboxWarning")


@pytest.fixture
def box() -> Iterator[LocalSandbox]:
    sandbox = LocalSandboxBackend().create(SandboxSpec())
    yield sandbox
    sandbox.close()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "hello.py").write_text("print('hello')\n")
    (root / "link").symlink_to("hello.py")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=root, check=True)
    return root


def alive(pattern: str) -> list[str]:
    """Pids whose command line has `pattern`; not the `nsenter` that started a command in the
    sandbox's pid namespace (its argv holds the command; it exits with it)."""
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [pid for pid in found.stdout.split() if _comm(pid) != "nsenter"]


def sleeping(pattern: str, want: int, timeout: float = 10.0) -> int:
    """How many `sleep` processes have `pattern` in their command line, once that is `want` or
    `timeout` has passed. Only the sleeps count: a shell whose argv holds the pattern for a
    moment before it execs, or a process mid-exec (its command line reads empty), would make a
    single look at `alive` count one too many or one too few."""
    deadline = time.monotonic() + timeout
    while True:
        found = len([pid for pid in alive(pattern) if _comm(pid) == "sleep"])
        if found == want or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def unique_sleep() -> tuple[str, str]:
    """A sleep whose command line is unique to this test, so pgrep finds only ours."""
    seconds = f"1000.{uuid.uuid4().int % 10**8}"
    return f"sleep {seconds}", seconds


def test_the_local_backend_is_found_by_its_entry_point_name() -> None:
    assert isinstance(load_sandbox("local"), LocalSandboxBackend)


def test_exec_reports_exit_code_stdout_and_stderr(box: LocalSandbox) -> None:
    result = box.exec("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert not result.timed_out


def test_exec_runs_an_argv_without_a_shell_and_feeds_stdin(box: LocalSandbox) -> None:
    assert box.exec(["cat"], stdin=b"piped").stdout == "piped"
    assert box.exec(["printf", "%s", "$HOME"]).stdout == "$HOME"


def test_a_command_runs_in_its_cwd_and_getcwd_works_there(box: LocalSandbox) -> None:
    """Commands join the sandbox's namespaces and then move to their cwd (`env --chdir`, see
    `_pidns.PidNamespace.prefix`); Codex, which exits when getcwd() fails, is the real check
    (tests/test_harness_fidelity.py, tests/test_harness_limits.py)."""
    sub = Path(box.workdir) / "sub"
    sub.mkdir()
    probe = ["python3", "-c", "import os; print(os.getcwd())"]
    assert box.exec(probe).stdout.strip() == str(Path(box.workdir).resolve())
    assert box.exec(probe, cwd=str(sub)).stdout.strip() == str(sub.resolve())
    assert box.exec("cd .. && pwd -P", cwd=str(sub)).exit_code == 0


def test_a_command_killed_by_a_signal_reports_minus_the_signal(box: LocalSandbox) -> None:
    assert box.exec("kill -9 $$").exit_code == -9


def test_a_timeout_kills_the_whole_process_group_including_a_grandchild(box: LocalSandbox) -> None:
    sleep, marker = unique_sleep()
    started = time.monotonic()
    result = box.exec(f"{sleep} & {sleep}", timeout=0.5)
    assert result.timed_out and result.exit_code == 124
    assert time.monotonic() - started < 5
    assert alive(marker) == []


def test_exec_returns_when_the_command_exits_although_a_background_child_lives_on(
    box: LocalSandbox,
) -> None:
    sleep, marker = unique_sleep()
    result = box.exec(f"{sleep} & echo started", timeout=10)
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "started\n", False)
    assert sleeping(marker, 1) == 1
    box.close()
    assert alive(marker) == []


def test_home_is_the_sandbox_home_and_the_host_secrets_stay_out(
    box: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    env = box.exec("env").stdout
    assert f"HOME={box.home}\n" in env
    assert "sk-host-secret" not in env
    # nor in the environment of the pid namespace's reaper, readable from inside as pid 1's
    assert "sk-host-secret" not in box.exec("cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'").stdout
    assert box.exec("cd && pwd").stdout.strip() == box.home
    assert box.exec("pwd").stdout.strip() == box.workdir


def test_spec_env_and_call_env_reach_the_command_but_home_stays_the_sandbox_home() -> None:
    with LocalSandboxBackend().create(SandboxSpec(env={"A": "spec", "B": "spec"})) as box:
        out = box.exec('echo "$A $B $HOME"', env={"B": "call", "HOME": "/elsewhere"}).stdout
        assert out == f"spec call {box.home}\n"


def test_a_background_job_can_be_waited_for(box: LocalSandbox) -> None:
    job = box.start("sleep 0.2; echo done; echo oops >&2; exit 3")
    assert job.poll() is None
    result = job.wait(timeout=10)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "done\n", "oops\n")
    assert job.poll() == 3


def test_waiting_on_a_job_past_its_timeout_kills_its_group(box: LocalSandbox) -> None:
    sleep, marker = unique_sleep()
    job = box.start(f"{sleep} & {sleep}")
    result = job.wait(timeout=0.3)
    assert result.timed_out and result.exit_code == 124
    assert alive(marker) == []


def test_killing_a_job_kills_its_group_even_after_the_leader_exited(box: LocalSandbox) -> None:
    sleep, marker = unique_sleep()
    job = box.start(f"{sleep} & echo started")
    assert job.wait(timeout=10).exit_code == 0
    assert sleeping(marker, 1) == 1
    job.kill()
    job.kill()  # idempotent
    assert alive(marker) == []


def test_killing_a_job_kills_its_setsid_escapees_but_not_another_jobs(box: LocalSandbox) -> None:
    mine, my_marker = unique_sleep()
    other, other_marker = unique_sleep()
    job = box.start(f"setsid -f {mine}; sleep 1000")
    box.start(other)
    deadline = time.monotonic() + 5
    while not (alive(my_marker) and alive(other_marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    job.kill()
    assert alive(my_marker) == []
    assert sleeping(other_marker, 1) == 1


def test_a_job_writes_its_output_where_it_was_asked_to(box: LocalSandbox) -> None:
    job = box.start(["echo", "logged"], stdout_path="../logs/harness.jsonl")
    job.wait(timeout=10)
    assert box.read_file("../logs/harness.jsonl") == b"logged\n"


def test_closing_kills_processes_that_escaped_the_group_with_setsid(box: LocalSandbox) -> None:
    sleep, marker = unique_sleep()
    box.exec(f"setsid {sleep} > /dev/null 2>&1 < /dev/null &")
    job = box.start(f"setsid -f {sleep}; sleep 1000")
    assert sleeping(marker, 2) == 2
    assert job.poll() is None
    box.close()
    assert alive(marker) == []
    assert marked_pids(SANDBOX_MARKER, box.id) == []


def test_a_binary_file_round_trips(box: LocalSandbox) -> None:
    data = bytes(range(256)) * 64
    box.write_file("sub/dir/blob.bin", data, mode=0o755)
    assert box.read_file("sub/dir/blob.bin") == data
    assert box.exec("sha256sum sub/dir/blob.bin && test -x sub/dir/blob.bin").exit_code == 0


def test_the_repo_is_copied_with_its_git_history_and_symlinks(repo: Path) -> None:
    with LocalSandboxBackend().create(SandboxSpec(repo=repo)) as box:
        assert box.exec("git log --oneline | wc -l").stdout.strip() == "1"
        assert os.readlink(Path(box.workdir, "link")) == "hello.py"
        box.write_file("hello.py", "print('changed')\n")
        assert "changed" in box.exec("git diff").stdout
    assert (repo / "hello.py").read_text() == "print('hello')\n"


def test_two_sandboxes_do_not_share_files(repo: Path) -> None:
    backend = LocalSandboxBackend()
    with backend.create(SandboxSpec(repo=repo)) as a, backend.create(SandboxSpec(repo=repo)) as b:
        a.write_file("only-in-a.txt", "a")
        a.exec("echo a > ~/state")
        assert a.workdir != b.workdir and a.home != b.home
        assert b.exec("test -e only-in-a.txt || test -e ~/state").exit_code == 1


def test_close_removes_the_temp_dir_even_with_read_only_dirs_and_is_idempotent() -> None:
    box = LocalSandboxBackend().create(SandboxSpec())
    root = box.root
    assert root.name.startswith("harness-gym-")
    box.exec("mkdir -p ro/sub && touch ro/sub/f && chmod -R a-w ro")
    box.close()
    assert not root.exists()
    box.close()


def test_a_closed_sandbox_refuses_new_commands() -> None:
    box = LocalSandboxBackend().create(SandboxSpec())
    box.close()
    with pytest.raises(SandboxError, match="closed"):
        box.exec("true")


@pytest.mark.filterwarnings("default::harness_gym.sandbox.UnisolatedSandboxWarning")
def test_the_local_backend_warns_that_it_is_not_safe_for_training() -> None:
    with pytest.warns(UnisolatedSandboxWarning, match="not to train"):
        load_sandbox("local")


def test_local_is_never_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # The choice alone, with the probes' answers replaced (the probes have their own tests in
    # test_sandbox_bwrap.py and test_sandbox_docker.py).
    monkeypatch.setattr(bwrap, "bwrap_available", lambda network="none": False)
    monkeypatch.setattr(docker, "docker_unavailable", lambda image="": None)
    assert default_sandbox() == "docker"
    monkeypatch.setattr(docker, "docker_unavailable", lambda image="": "no daemon")
    with pytest.raises(SandboxError) as raised:
        default_sandbox()
    said = str(raised.value)
    assert "apt-get install bubblewrap" in said and "no daemon" in said
    assert 'sandbox="local"' in said


ESCAPEES = (
    "env -i setsid -f {sleep}",  # no marker variable, a new session
    "env -i bash -c '( ( {sleep} & ) & )'",  # no marker, double-forked
    "env -i setsid -f bash -c 'trap \"\" TERM HUP; exec {sleep}'",  # and deaf to SIGTERM
)


@pytest.mark.skipif(pid_namespace() is None, reason="util-linux cannot make a pid namespace here")
def test_kill_processes_finds_what_scrubbed_its_environment_without_a_cgroup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sandbox's pid namespace alone (no cgroup: as a non-root user would have it) finds
    processes that left their session with a scrubbed environment, then the next command runs
    in a fresh namespace."""
    monkeypatch.setattr("harness_gym.sandbox.local.SandboxCgroup.make", lambda *a: None)
    sleep, marker = unique_sleep()
    with LocalSandbox(SandboxSpec()) as box:
        box.start("; ".join(e.format(sleep=sleep) for e in ESCAPEES) + "; sleep 1000")
        assert sleeping(marker, len(ESCAPEES)) == len(ESCAPEES)
        assert marked_pids(SANDBOX_MARKER, box.id) != []  # the harness itself still marked
        box.kill_processes()
        assert alive(marker) == []  # when kill_processes returns: exact, no wait
        assert box.exec(f"{sleep} & echo started").stdout == "started\n"
        assert sleeping(marker, 1) == 1  # a background child still outlives its command
    assert alive(marker) == []


def test_without_the_pid_namespace_such_a_process_would_have_escaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: with neither cgroup nor pid namespace, the marker search misses it."""
    monkeypatch.setattr("harness_gym.sandbox.local.SandboxCgroup.make", lambda *a: None)
    monkeypatch.setattr(LocalSandbox, "_pid_namespace_method", lambda self: None)
    sleep, marker = unique_sleep()
    try:
        with LocalSandbox(SandboxSpec()) as box:
            box.exec(ESCAPEES[0].format(sleep=sleep))
            box.kill_processes()
        assert sleeping(marker, 1) == 1
    finally:
        subprocess.run(["pkill", "-KILL", "-f", marker], capture_output=True)  # ours alone
