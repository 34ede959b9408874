"""What every sandbox backend whose processes run on this host must do, as one test class.

A backend's test module subclasses `SandboxConformance` and names the backend::

    class TestLocal(SandboxConformance):
        backend_name = "local"
        isolates_files = False

Real processes throughout: exit codes, output, timeouts that kill a grandchild too, background
jobs, binary files, HOME, isolation between two sandboxes, and a census of processes carrying
the sandbox marker after close. Processes are found by a command line unique to the test
(`unique_sleep`), so two tests, or two test runs, never see each other's.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from harness_gym.sandbox import (
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    load_sandbox,
)
from harness_gym.sandbox._processes import SANDBOX_MARKER, marked_pids


def alive(pattern: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", pattern], check=False, capture_output=True, text=True)
    return found.stdout.split()


def unique_sleep() -> tuple[str, str]:
    """A sleep whose command line is unique to this test, so pgrep finds only ours."""
    seconds = f"1000.{uuid.uuid4().int % 10**8}"
    return f"sleep {seconds}", seconds


def wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class SandboxConformance:
    backend_name: str
    isolates_files: bool = True  # one sandbox cannot see another's files at their host paths
    signal_exit_codes: tuple[int, ...] = (-9,)  # how `kill -9 $$` reads (bwrap: 137)

    @pytest.fixture
    def backend(self) -> Iterator[SandboxBackend]:
        backend = load_sandbox(self.backend_name)
        yield backend
        backend.close()

    @pytest.fixture
    def box(self, backend: SandboxBackend) -> Iterator[Sandbox]:
        sandbox = backend.create(SandboxSpec())
        yield sandbox
        sandbox.close()

    # -- exec ------------------------------------------------------------------------------

    def test_exec_reports_exit_code_stdout_and_stderr(self, box: Sandbox) -> None:
        result = box.exec("echo out; echo err >&2; exit 7")
        assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
        assert not result.timed_out

    def test_exec_runs_an_argv_without_a_shell_and_feeds_stdin(self, box: Sandbox) -> None:
        assert box.exec(["cat"], stdin=b"piped").stdout == "piped"
        assert box.exec(["printf", "%s", "$HOME"]).stdout == "$HOME"

    def test_a_command_killed_by_a_signal_says_so(self, box: Sandbox) -> None:
        assert box.exec("kill -9 $$").exit_code in self.signal_exit_codes

    def test_commands_run_in_the_workdir_or_the_cwd_they_name(self, box: Sandbox) -> None:
        box.exec("mkdir -p sub/dir")
        assert box.exec("pwd").stdout.strip() == box.workdir
        assert box.exec("pwd", cwd="sub/dir").stdout.strip() == f"{box.workdir}/sub/dir"

    def test_a_timeout_kills_the_whole_group_including_a_grandchild(self, box: Sandbox) -> None:
        sleep, marker = unique_sleep()
        started = time.monotonic()
        result = box.exec(f"bash -c '{sleep} & {sleep}' & {sleep}", timeout=0.5)
        assert result.timed_out and result.exit_code == 124
        assert time.monotonic() - started < 5
        assert wait_until(lambda: alive(marker) == [])

    def test_exec_returns_when_the_command_exits_although_a_background_child_lives_on(
        self, box: Sandbox
    ) -> None:
        sleep, marker = unique_sleep()
        result = box.exec(f"{sleep} & echo started", timeout=10)
        assert (result.exit_code, result.stdout, result.timed_out) == (0, "started\n", False)
        box.close()
        assert alive(marker) == []

    # -- HOME and environment -------------------------------------------------------------

    def test_home_is_the_sandbox_home_and_the_host_secrets_stay_out(
        self, box: Sandbox, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
        env = box.exec("env").stdout
        assert f"HOME={box.home}\n" in env
        assert "sk-host-secret" not in env
        assert box.exec("cd && pwd").stdout.strip() == box.home
        box.exec("echo state > ~/.harness-state")
        assert box.read_file(f"{box.home}/.harness-state") == b"state\n"

    def test_spec_env_and_call_env_reach_the_command_but_home_stays_the_sandbox_home(
        self, backend: SandboxBackend
    ) -> None:
        with backend.create(SandboxSpec(env={"A": "spec", "B": "spec"})) as box:
            out = box.exec('echo "$A $B $HOME"', env={"B": "call", "HOME": "/elsewhere"}).stdout
            assert out == f"spec call {box.home}\n"

    # -- background jobs ------------------------------------------------------------------

    def test_a_background_job_can_be_polled_and_waited_for(self, box: Sandbox) -> None:
        job = box.start("sleep 0.3; echo done; echo oops >&2; exit 3")
        assert job.poll() is None
        result = job.wait(timeout=10)
        assert (result.exit_code, result.stdout, result.stderr) == (3, "done\n", "oops\n")
        assert job.poll() == 3

    def test_waiting_on_a_job_past_its_timeout_kills_its_group(self, box: Sandbox) -> None:
        sleep, marker = unique_sleep()
        job = box.start(f"bash -c '{sleep} & {sleep}' & {sleep}")
        assert wait_until(lambda: len(alive(marker)) >= 3)  # shells and sleeps
        result = job.wait(timeout=0.3)
        assert result.timed_out and result.exit_code == 124
        assert wait_until(lambda: alive(marker) == [])

    def test_killing_a_job_kills_its_setsid_escapees_but_not_another_jobs(
        self, box: Sandbox
    ) -> None:
        mine, my_marker = unique_sleep()
        other, other_marker = unique_sleep()
        job = box.start(f"setsid -f {mine}; sleep 1000")
        other_job = box.start(other)
        assert wait_until(lambda: bool(alive(my_marker) and alive(other_marker)))
        job.kill()
        job.kill()  # idempotent
        assert wait_until(lambda: alive(my_marker) == [])
        assert job.poll() is not None
        assert other_job.poll() is None and alive(other_marker) != []

    # -- files ----------------------------------------------------------------------------

    def test_a_binary_file_round_trips_both_ways(self, box: Sandbox) -> None:
        data = bytes(range(256)) * 64
        box.write_file("sub/dir/blob.bin", data, mode=0o755)
        assert box.read_file("sub/dir/blob.bin") == data
        check = "test -x sub/dir/blob.bin && cmp sub/dir/blob.bin -"
        assert box.exec(check, stdin=data).exit_code == 0
        box.exec("tail -c +257 sub/dir/blob.bin > made-inside.bin")
        assert box.read_file(f"{box.workdir}/made-inside.bin") == data[256:]

    def test_reading_a_missing_file_is_a_sandbox_error(self, box: Sandbox) -> None:
        with pytest.raises(SandboxError):
            box.read_file("no/such/file")

    # -- isolation and cleanup ------------------------------------------------------------

    def test_one_sandbox_cannot_read_or_write_anothers_files_by_absolute_path(
        self, backend: SandboxBackend
    ) -> None:
        if not self.isolates_files:
            pytest.skip(f"{self.backend_name} shares the host filesystem by design")
        with backend.create(SandboxSpec()) as a, backend.create(SandboxSpec()) as b:
            b.write_file("secret.txt", "b's")
            b.exec("echo b > ~/state")
            assert a.workdir != b.workdir and a.home != b.home
            assert a.exec(f"cat {b.workdir}/secret.txt").exit_code != 0
            assert a.exec(f"cat {b.home}/state").exit_code != 0
            a.exec(f"echo a > {b.workdir}/secret.txt; echo a > {b.workdir}/planted.txt")
            assert b.read_file("secret.txt") == b"b's"
            with pytest.raises(SandboxError):
                b.read_file("planted.txt")

    def test_two_sandboxes_do_not_share_work_dirs_or_homes(self, backend: SandboxBackend) -> None:
        with backend.create(SandboxSpec()) as a, backend.create(SandboxSpec()) as b:
            a.write_file("only-in-a.txt", "a")
            a.exec("echo a > ~/state")
            assert b.exec("test -e only-in-a.txt || test -e ~/state").exit_code == 1

    def test_close_kills_every_process_and_removes_every_file(self, backend: SandboxBackend) -> None:
        box = backend.create(SandboxSpec())
        sleep, marker = unique_sleep()
        box.exec(f"setsid {sleep} > /dev/null 2>&1 < /dev/null &")
        box.start(f"setsid -f {sleep}; {sleep} & sleep 1000")
        assert wait_until(lambda: len(alive(marker)) >= 2)
        box.exec("mkdir -p ro/sub && touch ro/sub/f && chmod -R a-w ro")
        workdir, home = box.workdir, box.home
        box.close()
        assert wait_until(lambda: alive(marker) == [])
        census = getattr(box, "id", None)
        if census is not None:
            assert marked_pids(SANDBOX_MARKER, census) == []
        assert not os.path.exists(workdir) and not os.path.exists(home)
        box.close()  # idempotent
        with pytest.raises(SandboxError, match="closed"):
            box.exec("true")

