"""The e2b backend: the shared conformance suites over a fake of the e2b SDK (tests/support/
fake_e2b.py, which runs the SDK's commands on this host and raises the SDK's own exceptions),
what the backend asks of the SDK, how it tells a command's timeout from a dead or unreachable
VM, templates, the missing-key error from the real SDK, and the suite live where E2B_API_KEY is
set. The E2B cloud cannot run here: the fake stands in for it at the SDK boundary."""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_conformance import QUICK_STOPS, RemoteSandboxConformance
from sandbox_conformance import SandboxConformance

pytest.importorskip(
    "e2b", reason="the e2b SDK is not installed (pip install 'harness-gym[e2b]')"
)

import e2b
from connectrpc.code import Code
from support import fake_e2b

from harness_gym.sandbox import (
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    load_sandbox,
)
from harness_gym.sandbox.e2b import E2BSandbox, E2BSandboxBackend


TEMPLATES = {"base", "base-tpl", "tpl-from-image"}  # what "exists" in the fake's E2B team


@pytest.fixture(autouse=True)
def e2b_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_e2b.Sandbox, "templates", TEMPLATES)


def fake_backend(**options: Any) -> E2BSandboxBackend:
    options.setdefault("stop_delays_s", QUICK_STOPS)
    return E2BSandboxBackend(sandbox_factory=fake_e2b.Sandbox.create, **options)


def sdk_of(box: Sandbox) -> fake_e2b.Sandbox:
    assert isinstance(box, E2BSandbox) and isinstance(box.sdk, fake_e2b.Sandbox)
    return box.sdk


class TestE2BOverTheFakeSDK(RemoteSandboxConformance, SandboxConformance):
    backend_name = "e2b"
    isolates_files = False  # the fake's "VMs" share this host's filesystem
    signal_exit_codes = (137,)  # our wrapper shell reports a signal death as 128+n

    def make_backend(self, **options: Any) -> E2BSandboxBackend:
        return fake_backend(**options)

    def end_machine(self, box: Sandbox) -> None:
        sdk_of(box).end()

    def machine_gone(self, box: Sandbox) -> bool:
        return sdk_of(box).gone

    def refuse_stops(self, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
        monkeypatch.setattr(fake_e2b.Sandbox, "kill_failures", n)


@pytest.mark.skipif(
    not os.environ.get("E2B_API_KEY"), reason="E2B_API_KEY is not set: no live E2B run"
)
class TestE2BLive(SandboxConformance):
    """The suite against real E2B VMs. Process censuses by pgrep look at this host, where the
    VM's processes never are, so they pass trivially; exit codes, timeouts, files and HOME are
    checked for real."""

    backend_name = "e2b"
    signal_exit_codes = (137,)

    @pytest.fixture
    def backend(self) -> Iterator[SandboxBackend]:
        backend = E2BSandboxBackend(template=os.environ.get("E2B_TEMPLATE"))
        yield backend
        backend.close()


# -- construction and keys ------------------------------------------------------------------


def test_the_e2b_backend_is_found_by_its_entry_point_name() -> None:
    assert isinstance(load_sandbox("e2b"), E2BSandboxBackend)


def test_a_missing_key_is_named_at_create_before_the_sdk_is_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(SandboxError, match="E2B_API_KEY"):
        E2BSandboxBackend().create(SandboxSpec())


def test_the_real_sdk_refusing_a_missing_key_is_reported_with_the_variable_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The real e2b.Sandbox.create raises AuthenticationException while building its API client,
    # before any request (e2b/api/__init__.py), so this touches no network.
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    backend = E2BSandboxBackend(sandbox_factory=e2b.Sandbox.create)
    with pytest.raises(SandboxError, match="E2B_API_KEY") as caught:
        backend.create(SandboxSpec())
    assert isinstance(caught.value.__cause__, e2b.AuthenticationException)


def test_create_passes_template_lifetime_envs_and_key_to_the_sdk() -> None:
    backend = fake_backend(
        template="base-tpl",
        templates={"docker.io/org/task:1": "tpl-from-image"},
        timeout_s=900,
        api_key="e2b_k",
        envs={"X": "1"},
    )
    with (
        backend.create(SandboxSpec()) as box,
        backend.create(SandboxSpec(image="docker.io/org/task:1")) as other,
    ):
        assert sdk_of(box).calls[0] == (
            "create",
            {"template": "base-tpl", "timeout": 900, "envs": {"X": "1"}, "api_key": "e2b_k"},
        )
        assert sdk_of(other).template == "tpl-from-image"


def test_a_task_image_without_a_template_is_refused_before_the_sdk_is_called() -> None:
    made = len(fake_e2b.Sandbox.created)
    with pytest.raises(SandboxError, match=r"templates=\{'swebench/sweb.eval.x86_64.a:latest'"):
        fake_backend().create(SandboxSpec(image="swebench/sweb.eval.x86_64.a:latest"))
    assert len(fake_e2b.Sandbox.created) == made


def test_a_template_e2b_does_not_know_is_reported_as_such() -> None:
    with pytest.raises(SandboxError, match="does the template exist") as caught:
        fake_backend(template="no-such-template").create(SandboxSpec())
    assert isinstance(caught.value.__cause__, e2b.SandboxException)
    assert caught.value.__cause__.status_code == 404


def test_a_dataset_row_whose_repo_lives_in_its_image_is_refused() -> None:
    with pytest.raises(SandboxError, match='sandbox="docker"'):
        fake_backend().create(SandboxSpec(image="img", workdir="/testbed"))


def test_a_sandbox_reaches_the_proxy_at_the_public_url_with_the_proxy_path() -> None:
    backend = fake_backend(proxy_public_url="https://proxy.example.com/")
    with backend.create(SandboxSpec()) as sandbox:
        assert sandbox.proxy_url("http://127.0.0.1:8123/v1") == "https://proxy.example.com/v1"
    with fake_backend().create(SandboxSpec()) as sandbox:
        with pytest.raises(SandboxError, match="proxy_public_url"):
            sandbox.proxy_url("http://127.0.0.1:8123/v1")


# -- what each seam call asks of the SDK ----------------------------------------------------


def test_the_repo_goes_up_as_one_tar_and_comes_out_with_its_git_history(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("x = 1\n")
    (repo / "link").symlink_to("pkg/mod.py")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "base"], check=True)
    with fake_backend().create(SandboxSpec(repo=repo)) as box:
        writes = [args for name, args in sdk_of(box).calls if name == "files.write"]
        assert len(writes) == 1 and writes[0]["path"].endswith(".tar.gz")
        assert box.read_file("pkg/mod.py") == b"x = 1\n"
        said = box.exec("readlink link && git log --format=%s").stdout
        assert said == "pkg/mod.py\nbase\n"


def test_exec_sends_env_cwd_and_timeout_to_the_sdk_and_maps_a_failure() -> None:
    with fake_backend().create(SandboxSpec(env={"SPEC": "s"})) as box:
        box.exec("mkdir sub")
        sdk = sdk_of(box)
        sdk.calls.clear()
        result = box.exec(
            ["sh", "-c", "echo $CALL; exit 3"], cwd="sub", env={"CALL": "c"}, timeout=7
        )
        assert (result.exit_code, result.stdout) == (3, "c\n")  # CommandExitException, mapped
        ((name, args),) = sdk.calls
        assert name == "commands.run" and args["background"] is None
        assert (args["cwd"], args["timeout"]) == (f"{box.workdir}/sub", 7)
        assert args["envs"]["SPEC"] == "s" and args["envs"]["CALL"] == "c"
        # The SDK's login shell starts in a HOME that does not exist; the command puts ours back.
        assert args["envs"]["HOME"].startswith("/nonexistent/")
        assert args["cmd"].startswith(f"export HOME={box.home}; ")
        inner = shlex.split(args["cmd"].split("exec /bin/bash --noprofile --norc -c ", 1)[1])[0]
        assert "{ sh -c 'echo $CALL; exit 3' ; }" in inner
        assert box.exec("echo $HOME").stdout == f"{box.home}\n"


@pytest.mark.parametrize("name", [".bash_profile", ".bash_login", ".profile", ".bash_logout"])
def test_a_login_file_the_agent_writes_never_runs_in_a_later_command(name: str,
                                                                     tmp_path: Path) -> None:
    # The SDK runs every command through `bash -l`: a profile the agent planted would run before
    # the grader's commands (and a logout file after them), as the agent's user.
    ran = tmp_path / "ran"
    with fake_backend().create(SandboxSpec()) as box:
        for home in (box.home, sdk_of(box).user_home):  # the episode's HOME, the VM user's
            box.exec(f"echo 'echo {name} >> {ran}' > {home}/{name}")
        assert box.exec("exit 0").exit_code == 0
        assert box.exec("true", env={"HOME": sdk_of(box).user_home}).exit_code == 0
        assert box.start("exit 0").wait(10).exit_code == 0
        assert box.exec(f"cat {box.home}/{name}").stdout == f"echo {name} >> {ran}\n"
    assert not ran.exists()


def test_exec_without_a_timeout_asks_the_sdk_for_none_not_its_60_s_default() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        sdk_of(box).calls.clear()
        box.exec("true")
        assert sdk_of(box).calls[-1][1]["timeout"] == 0


def test_a_path_the_caller_sets_survives_the_sdks_login_shell(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "only-here"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(0o755)
    with fake_backend().create(SandboxSpec()) as box:
        path = f"{tool.parent}:/usr/bin:/bin"
        assert box.exec("only-here", env={"PATH": path}).stdout == "found\n"
        assert box.start("only-here", env={"PATH": path}).wait(10).stdout == "found\n"


def test_start_runs_in_the_background_without_a_connection_timeout() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        sdk_of(box).calls.clear()
        job = box.start("echo hi", cwd=".", env={"J": "1"})
        assert job.wait(10).stdout == "hi\n"
        name, args = sdk_of(box).calls[0]
        assert (name, args["background"], args["timeout"], args["cwd"]) == (
            "commands.run",
            True,
            0,
            f"{box.workdir}/.",
        )
        assert args["envs"]["J"] == "1"


def test_start_writes_stdout_where_asked() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        result = box.start("echo to-file; echo e >&2", stdout_path="logs/run.out").wait(10)
        assert result.stdout == "to-file\n" and result.stderr == "e\n"
        assert box.read_file("logs/run.out") == b"to-file\n"
        assert box.read_file("logs/run.out.stderr") == b"e\n"


def test_files_go_through_the_sdk_in_bytes_at_workdir_relative_paths() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        sdk_of(box).calls.clear()
        box.write_file("a/b.txt", "text")
        assert box.read_file("a/b.txt") == b"text"
        assert box.read_file(f"{box.home}/../work/a/b.txt") == b"text"
        files = [(n, a) for n, a in sdk_of(box).calls if n.startswith("files.")]
        assert files[0] == ("files.write", {"path": f"{box.workdir}/a/b.txt", "size": 4})
        assert files[1] == ("files.read", {"path": f"{box.workdir}/a/b.txt", "format": "bytes"})


def test_close_kills_the_vm_once() -> None:
    box = fake_backend().create(SandboxSpec())
    box.close()
    box.close()
    assert [name for name, _ in sdk_of(box).calls].count("kill") == 1
    assert sdk_of(box).gone


# -- a timeout, a cancel, a dropped stream: what each SDK exception means ------------------


def test_only_a_timeout_exception_at_the_commands_own_deadline_is_a_timeout() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        started = time.monotonic()
        result = box.exec("sleep 30", timeout=0.4)  # the SDK's DEADLINE_EXCEEDED
        assert (result.timed_out, result.exit_code) == (True, 124)
        assert time.monotonic() - started < 10


def test_a_call_cancelled_before_its_timeout_is_a_sandbox_error_not_a_timeout() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        cancel = fake_e2b.rpc_error(Code.CANCELED, "stream cancelled by the proxy")
        assert type(cancel) is e2b.TimeoutException  # what e2b 2.63 makes of a cancel
        sdk_of(box).commands.next_run_error = cancel
        with pytest.raises(SandboxError, match="cancelled before its timeout"):
            box.exec("true", timeout=30)


def test_an_unreachable_vm_is_a_sandbox_error_that_says_so() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        unreachable = fake_e2b.stream_broken(sdk_of(box), vm_alive=True)
        assert isinstance(unreachable, e2b.SandboxUnreachableException)
        sdk_of(box).commands.next_run_error = unreachable
        with pytest.raises(SandboxError, match="cannot be reached"):
            box.exec("true", timeout=30)


def test_a_dead_vm_says_not_running_and_names_its_lifetime() -> None:
    with fake_backend(timeout_s=777).create(SandboxSpec()) as box:
        sdk_of(box).end()
        with pytest.raises(SandboxError, match="not running any more.*timeout_s=777") as caught:
            box.exec("true")
        assert isinstance(caught.value.__cause__, e2b.SandboxNotRunningException)


def test_a_vm_that_ends_at_its_lifetime_fails_the_command_running_on_it() -> None:
    with fake_backend(timeout_s=2).create(SandboxSpec()) as box:
        with pytest.raises(SandboxError, match="not running any more"):
            box.exec("sleep 30", timeout=20)


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """Exceptions that escape any thread (the job's waiter must let none escape)."""
    caught: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: caught.append(args.exc_value))
    return caught


@pytest.mark.parametrize(
    "broken",
    [
        lambda box: fake_e2b.stream_broken(box, vm_alive=True),  # SandboxUnreachableException
        lambda box: Exception("Command ended without an end event"),  # the SDK's bare Exception
    ],
    ids=["unreachable", "no-end-event"],
)
def test_a_dropped_stream_is_reconnected_while_the_vm_runs(broken, thread_errors) -> None:
    with fake_backend().create(SandboxSpec()) as box:
        job = box.start("sleep 0.6; echo done; exit 4")
        time.sleep(0.2)
        for handle in sdk_of(box).open_handles:
            handle.broken = broken(sdk_of(box))
        result = job.wait(timeout=20)
        assert (result.exit_code, result.stdout, result.timed_out) == (4, "done\n", False)
        connects = [args for name, args in sdk_of(box).calls if name == "commands.connect"]
        assert connects and connects[0]["timeout"] == 0
    assert thread_errors == []


def test_a_command_that_ended_while_its_stream_was_down_reports_its_own_exit_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fake_backend().create(SandboxSpec()) as box:
        commands = sdk_of(box).commands
        reconnect = commands.connect

        def connect_after_the_end(pid: int, *args: Any, **kwargs: Any) -> Any:
            while not commands.processes[pid].ended():  # it ends while the stream is down
                time.sleep(0.01)
            return reconnect(pid, *args, **kwargs)  # envd forgot it: NotFoundException

        monkeypatch.setattr(commands, "connect", connect_after_the_end)
        job = box.start("sleep 0.3; exit 6")
        time.sleep(0.1)
        for handle in sdk_of(box).open_handles:
            handle.broken = Exception("Command ended without an end event")
        assert job.wait(timeout=20).exit_code == 6  # from the file the wrapper wrote


def test_a_bare_exception_from_the_sdk_on_a_dead_vm_fails_the_wait_and_escapes_no_thread(
    thread_errors, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fake_backend().create(SandboxSpec()) as box:
        job = box.start("sleep 30")
        time.sleep(0.2)
        # The VM's health check says it is gone, and the stream ends without an end event.
        monkeypatch.setattr(sdk_of(box), "is_running", lambda request_timeout=None: False)
        for handle in sdk_of(box).open_handles:
            handle.broken = Exception("Command ended without an end event")
        with pytest.raises(SandboxError, match="Command ended without an end event"):
            job.wait(timeout=20)
    assert thread_errors == []
