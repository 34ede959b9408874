"""The e2b backend: the shared conformance suite over a fake of the e2b SDK (tests/support/
fake_e2b.py, which runs the SDK's commands on this host), what the backend asks of the SDK,
the missing-key error from the real SDK, and the same suite live where E2B_API_KEY is set."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_conformance import SandboxConformance

pytest.importorskip(
    "e2b", reason="the e2b SDK is not installed (pip install 'harness-gym[e2b]')"
)

import e2b
from support import fake_e2b

from harness_gym.sandbox import (
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    load_sandbox,
)
from harness_gym.sandbox.e2b import E2BSandbox, E2BSandboxBackend


def fake_backend(**options: object) -> E2BSandboxBackend:
    return E2BSandboxBackend(sandbox_factory=fake_e2b.Sandbox.create, **options)  # type: ignore[arg-type]


def sdk_of(box: Sandbox) -> fake_e2b.Sandbox:
    assert isinstance(box, E2BSandbox) and isinstance(box.sdk, fake_e2b.Sandbox)
    return box.sdk


class TestE2BOverTheFakeSDK(SandboxConformance):
    backend_name = "e2b"
    isolates_files = False  # the fake's "VMs" share this host's filesystem
    signal_exit_codes = (137,)  # our wrapper shell reports a signal death as 128+n

    @pytest.fixture
    def backend(self) -> Iterator[SandboxBackend]:
        backend = fake_backend()
        yield backend
        backend.close()


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
        template="base-tpl", timeout_s=900, api_key="e2b_k", envs={"X": "1"}
    )
    with (
        backend.create(SandboxSpec()) as box,
        backend.create(SandboxSpec(image="other")) as other,
    ):
        assert sdk_of(box).calls[0] == (
            "create",
            {
                "template": "base-tpl",
                "timeout": 900,
                "envs": {"X": "1"},
                "api_key": "e2b_k",
            },
        )
        assert sdk_of(other).template == "other"


def test_a_sandbox_reaches_the_proxy_at_the_public_url_with_the_proxy_path() -> None:
    with fake_backend(proxy_public_url="https://proxy.example.com/").create(SandboxSpec()) as sandbox:
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
        assert (
            box.exec("readlink link && git log --format=%s").stdout
            == "pkg/mod.py\nbase\n"
        )


def test_exec_sends_env_cwd_and_timeout_to_the_sdk_and_maps_a_failure() -> None:
    with fake_backend().create(SandboxSpec(env={"SPEC": "s"})) as box:
        box.exec("mkdir sub")
        sdk = sdk_of(box)
        sdk.calls.clear()
        result = box.exec(
            ["sh", "-c", "echo $CALL; exit 3"], cwd="sub", env={"CALL": "c"}, timeout=7
        )
        assert (result.exit_code, result.stdout) == (
            3,
            "c\n",
        )  # CommandExitException, mapped
        ((name, args),) = sdk.calls
        assert name == "commands.run" and args["background"] is None
        assert (args["cwd"], args["timeout"]) == (f"{box.workdir}/sub", 7)
        assert args["envs"]["SPEC"] == "s" and args["envs"]["CALL"] == "c"
        assert args["envs"]["HOME"] == box.home
        assert "{ sh -c 'echo $CALL; exit 3' ; }" in args["cmd"]


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
        result = box.start("echo to-file; echo e >&2", stdout_path="logs/run.out").wait(
            10
        )
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
        assert files[0] == (
            "files.write",
            {"path": f"{box.workdir}/a/b.txt", "size": 4},
        )
        assert files[1] == (
            "files.read",
            {"path": f"{box.workdir}/a/b.txt", "format": "bytes"},
        )


def test_close_kills_the_vm_once() -> None:
    box = fake_backend().create(SandboxSpec())
    box.close()
    box.close()
    assert [name for name, _ in sdk_of(box).calls].count("kill") == 1
    assert sdk_of(box).killed
