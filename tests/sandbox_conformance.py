"""What every sandbox backend whose processes run on this host must do, as one test class.

A backend's test module subclasses `SandboxConformance` and names the backend::

    class TestLocal(SandboxConformance):
        backend_name = "local"
        isolates_files = False

Real processes throughout: exit codes, output, timeouts that kill a grandchild too, background
jobs, binary files, HOME, isolation between two sandboxes, and a census of processes carrying
the sandbox marker after close. Processes are found by a command line unique to the test
(`unique_sleep`), so two tests, or two test runs, never see each other's.

What an agent can do to the episode is here too (attack class 7 of issue 11, and faults that
must stay inside one rollout): `kill_processes()` ends every escapee the backend can see (all of
them where `kills_every_escapee`), a background writer cannot touch the tree after it, a fork
bomb stops at the pids cap (`caps_pids`), megabytes of output come back capped, and the
interpreter's sys.path is read-only inside (`protects_interpreter`).
"""

from __future__ import annotations

import os
import resource
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


# Every way a process can leave its parent's process group and session, started from one job.
ESCAPES = (
    "setsid -f {sleep}",  # a new session
    "( ( {sleep} & ) & )",  # a double fork: reparented to init
    "nohup {sleep} >/dev/null 2>&1 &",  # immune to SIGHUP
    "python3 -c 'import os; os.setpgid(0, 0); os.execvp(\"sleep\", [\"sleep\", \"{secs}\"])' &",
)
SCRUBBED = "env -i setsid -f {sleep}"  # no marker variable left to find it by

OUTPUT_LIMIT = 32 * 2**20  # harness_gym.sandbox.local.OUTPUT_LIMIT_BYTES, as documented


class SandboxConformance:
    backend_name: str
    isolates_files: bool = True  # one sandbox cannot see another's files at their host paths
    signal_exit_codes: tuple[int, ...] = (-9,)  # how `kill -9 $$` reads (bwrap: 137)
    # kill_processes() also finds processes that scrubbed their environment (pid namespace,
    # cgroup, container); the marker search of local and the cloud backends cannot.
    kills_every_escapee: bool = False
    caps_pids: bool = False  # a fork bomb stops at the backend's `pids`
    caps_output: bool = False  # exec returns at most the last OUTPUT_LIMIT bytes of a stream
    protects_interpreter: bool = False  # nothing on python3's sys.path is writable inside

    def limited_backend(self, pids: int) -> SandboxBackend:
        """A backend of this kind with a pids cap of `pids` (backends with `caps_pids`)."""
        raise NotImplementedError

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


    # -- what an agent leaves behind, and faults that stay inside the rollout ------------------

    def test_kill_processes_kills_every_escapee_and_keeps_the_files(self, box: Sandbox) -> None:
        sleep, marker = unique_sleep()
        secs = sleep.split()[1]
        escapes = [e.format(sleep=sleep, secs=secs) for e in ESCAPES]
        if self.kills_every_escapee:
            escapes.append(SCRUBBED.format(sleep=sleep))
        box.write_file("kept.txt", "the agent's work")
        job = box.start("\n".join([*escapes, f"exec {sleep}"]))
        assert wait_until(lambda: len(alive(marker)) >= len(escapes) + 1, timeout=15)
        box.kill_processes()
        assert alive(marker) == []  # at once: no grace period for a writer to use
        assert job.poll() is not None
        assert box.read_file("kept.txt") == b"the agent's work"
        assert box.exec("cat kept.txt").stdout == "the agent's work"  # commands run after it

    def test_a_background_writer_cannot_touch_the_tree_after_kill_processes(
        self, box: Sandbox
    ) -> None:
        # Attack 7: a loop the agent left would rewrite a test file while the grader runs.
        box.write_file("test_it.py", "def test_it():\n    assert False\n")
        box.write_file("forged.py", "def test_it():\n    assert True\n")
        writer = "while :; do cp forged.py test_it.py; sleep 0.01; done"
        escape = "setsid -f" if not self.kills_every_escapee else "env -i setsid -f"
        box.start(f"{escape} bash -c '{writer}'; sleep 1000")
        assert wait_until(lambda: b"True" in box.read_file("test_it.py"), timeout=15)
        box.kill_processes()
        box.write_file("test_it.py", "def test_it():\n    assert False\n")  # the grader's restore
        time.sleep(0.5)
        assert box.read_file("test_it.py") == b"def test_it():\n    assert False\n"

    def test_kill_processes_on_an_idle_sandbox_is_harmless_and_repeatable(
        self, box: Sandbox
    ) -> None:
        box.kill_processes()
        box.kill_processes()
        assert box.exec("echo still here").stdout == "still here\n"

    def test_a_fork_bomb_stops_at_the_pids_cap_and_other_sandboxes_still_run(self) -> None:
        if not self.caps_pids:
            pytest.skip(f"{self.backend_name} cannot cap processes here")
        token = uuid.uuid4().hex[:12]
        backend = self.limited_backend(pids=64)
        try:
            with backend.create(SandboxSpec()) as bomb, backend.create(SandboxSpec()) as other:
                bomb.start(f"bash -c 'b() {{ b | b & }}; b; : {token}'; sleep 1000")
                time.sleep(3)
                assert len(alive(token)) <= 64  # seen from the host: the cap holds
                assert other.exec("echo ok", timeout=60).stdout == "ok\n"
                started = time.monotonic()
                bomb.kill_processes()
                assert time.monotonic() - started < 30
                assert wait_until(lambda: alive(token) == [], timeout=10)
                assert bomb.exec("echo calm", timeout=60).stdout == "calm\n"
        finally:
            backend.close()

    def test_megabytes_of_output_come_back_capped_and_memory_stays_flat(
        self, box: Sandbox
    ) -> None:
        if not self.caps_output:
            pytest.skip(f"{self.backend_name} returns whole outputs")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        flood = "head -c 268435456 /dev/zero | tr '\\0' x; echo END"  # 256 MiB
        result = box.exec(flood, timeout=300)
        assert result.exit_code == 0, result.stderr[-500:]
        assert len(result.stdout) <= OUTPUT_LIMIT and result.stdout.endswith("xEND\n")
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        assert grown < 4 * OUTPUT_LIMIT, f"{grown / 2**20:.0f} MiB more at the peak"

    def test_nothing_on_the_interpreters_sys_path_is_writable_inside(self, box: Sandbox) -> None:
        if not self.protects_interpreter:
            pytest.skip(f"{self.backend_name} does not protect the host's interpreter")
        # What the grader's `python -m pytest` would load at start: a .pth or sitecustomize.py
        # anywhere on sys.path but the repo (the user site is the grader's to switch off).
        plant = (
            "import os, site, sys\n"
            "user = site.getusersitepackages()\n"
            "dirs = [p for p in sys.path if p and os.path.isdir(p) and p != os.getcwd()"
            " and not p.startswith(user)]\n"
            "planted = []\n"
            "for d in dirs:\n"
            "    for name in ('harness_gym_probe.pth', 'sitecustomize.py', 'usercustomize.py'):\n"
            "        try:\n"
            "            with open(os.path.join(d, name), 'a') as f:\n"
            "                f.write('import os\\n')\n"
            "            planted.append(os.path.join(d, name))\n"
            "        except OSError:\n"
            "            pass\n"
            "print(len(dirs), planted)\n"
        )
        for python in ("python3", "python"):
            result = box.exec([python, "-c", plant])
            if result.exit_code == 127:  # no such interpreter in this sandbox
                continue
            n_dirs, planted = result.stdout.split(" ", 1)
            assert result.exit_code == 0 and int(n_dirs) >= 2, result.stderr
            assert planted.strip() == "[]"
