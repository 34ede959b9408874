"""The hf backend: the shared conformance suites over a fake of `huggingface_hub.Sandbox`
(tests/support/fake_hf_sandbox.py, which runs the SDK's commands on this host and raises the
SDK's own exceptions), what the backend asks of the SDK, a job stop that is checked against the
Jobs API, the missing-token error, and the suite live where HF_TOKEN is set. HF Jobs cannot run
here: the fake stands in for them at the SDK boundary."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_conformance import QUICK_STOPS, RemoteSandboxConformance
from sandbox_conformance import SandboxConformance

hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed")
if not hasattr(hub, "Sandbox"):
    pytest.skip(
        "huggingface_hub has no Sandbox (needs >= 2.4)", allow_module_level=True
    )

from support import fake_hf_sandbox

from harness_gym.sandbox import (
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    load_sandbox,
)
from harness_gym.sandbox._reaper import UnstoppedSandboxWarning
from harness_gym.sandbox.hf import HFSandbox, HFSandboxBackend


def fake_backend(**options: Any) -> HFSandboxBackend:
    options.setdefault("stop_delays_s", QUICK_STOPS)
    options.setdefault("jobs_api", fake_hf_sandbox.HfApi())
    return HFSandboxBackend(sandbox_factory=fake_hf_sandbox.Sandbox.create, **options)


def sdk_of(box: Sandbox) -> fake_hf_sandbox.Sandbox:
    assert isinstance(box, HFSandbox) and isinstance(box.sdk, fake_hf_sandbox.Sandbox)
    return box.sdk


class TestHFOverTheFakeSDK(RemoteSandboxConformance, SandboxConformance):
    backend_name = "hf"
    isolates_files = False  # the fake's "jobs" share this host's filesystem
    signal_exit_codes = (137,)  # our wrapper shell reports a signal death as 128+n

    def make_backend(self, **options: Any) -> HFSandboxBackend:
        return fake_backend(**options)

    def end_machine(self, box: Sandbox) -> None:
        sdk_of(box).end()

    def machine_gone(self, box: Sandbox) -> bool:
        return sdk_of(box).stage != "RUNNING"

    def refuse_stops(self, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
        monkeypatch.setattr(fake_hf_sandbox.Sandbox, "cancel_failures", n)


@pytest.mark.skipif(
    not os.environ.get("HF_TOKEN"), reason="HF_TOKEN is not set: no live HF Jobs run"
)
class TestHFLive(SandboxConformance):
    """The suite against real HF Jobs sandboxes (billed). Process censuses by pgrep look at this
    host, where the job's processes never are, so they pass trivially."""

    backend_name = "hf"
    signal_exit_codes = (137,)

    @pytest.fixture
    def backend(self) -> Iterator[SandboxBackend]:
        backend = HFSandboxBackend(
            image=os.environ.get("HF_SANDBOX_IMAGE", "python:3.12")
        )
        yield backend
        backend.close()


# -- construction and tokens ----------------------------------------------------------------


def test_the_hf_backend_is_found_by_its_entry_point_name() -> None:
    assert isinstance(load_sandbox("hf"), HFSandboxBackend)


def test_a_missing_token_is_named_at_create(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
    if hub.get_token():
        pytest.skip("a Hugging Face token is stored on this machine")
    with pytest.raises(SandboxError, match="HF_TOKEN"):
        HFSandboxBackend().create(SandboxSpec())


def test_create_passes_image_flavor_idle_timeout_env_and_token_to_the_sdk() -> None:
    backend = fake_backend(
        image="img:1",
        flavor="cpu-upgrade",
        idle_timeout=120,
        token="hf_t",
        env={"X": "1"},
    )
    with (
        backend.create(SandboxSpec()) as box,
        backend.create(SandboxSpec(image="img:2")) as other,
    ):
        assert sdk_of(box).calls[0] == (
            "create",
            {
                "image": "img:1",
                "flavor": "cpu-upgrade",
                "idle_timeout": 120,
                "env": {"X": "1"},
                "namespace": None,
                "token": "hf_t",
            },
        )
        assert sdk_of(other).image == "img:2"


def test_a_sandbox_reaches_the_proxy_at_the_public_url_with_the_proxy_path() -> None:
    backend = fake_backend(proxy_public_url="https://proxy.example.com")
    with backend.create(SandboxSpec()) as sandbox:
        assert sandbox.proxy_url("http://127.0.0.1:8123/v1") == "https://proxy.example.com/v1"
    with fake_backend().create(SandboxSpec()) as sandbox:
        with pytest.raises(SandboxError, match="proxy_public_url"):
            sandbox.proxy_url("http://127.0.0.1:8123/v1")


# -- what each seam call asks of the SDK ----------------------------------------------------


def test_exec_sends_an_argv_env_cwd_and_timeout_and_never_lets_the_sdk_raise() -> None:
    with fake_backend().create(SandboxSpec(env={"SPEC": "s"})) as box:
        box.exec("mkdir sub")
        sdk = sdk_of(box)
        sdk.calls.clear()
        result = box.exec(
            ["sh", "-c", "echo $CALL; exit 3"], cwd="sub", env={"CALL": "c"}, timeout=7
        )
        assert (result.exit_code, result.stdout) == (3, "c\n")
        ((name, args),) = sdk.calls
        assert name == "run" and args["shell"] is False and args["check"] is False
        assert args["cmd"][:2] == ["bash", "-c"]
        assert "sh -c 'echo $CALL; exit 3'" in args["cmd"][2]
        assert (args["cwd"], args["timeout"]) == (f"{box.workdir}/sub", 7)
        assert args["background"] is False
        assert args["env"]["SPEC"] == "s" and args["env"]["CALL"] == "c"
        assert args["env"]["HOME"] == box.home


def test_a_timeout_the_sdk_reports_is_a_timed_out_result() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        result = box.exec("echo partial; sleep 30", timeout=0.3)
        assert (result.exit_code, result.timed_out, result.stdout) == (124, True, "partial\n")


def test_start_runs_in_the_background_and_waits_by_listing_processes() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        sdk_of(box).calls.clear()
        job = box.start("echo hi; exit 5", env={"J": "1"})
        result = job.wait(10)
        assert (result.exit_code, result.stdout) == (5, "hi\n")
        name, args = sdk_of(box).calls[0]
        assert (name, args["background"], args["env"]["J"]) == ("run", True, "1")
        assert ("processes", {}) in sdk_of(box).calls


def test_start_writes_stdout_where_asked() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        result = box.start("echo to-file; echo e >&2", stdout_path="logs/run.out").wait(10)
        assert result.stdout == "to-file\n" and result.stderr == "e\n"
        assert box.read_file("logs/run.out") == b"to-file\n"


def test_files_go_through_the_sdk_at_workdir_relative_paths() -> None:
    with fake_backend().create(SandboxSpec()) as box:
        sdk_of(box).calls.clear()
        box.write_file("a/b.txt", "text")
        assert box.read_file("a/b.txt") == b"text"
        files = [(n, a) for n, a in sdk_of(box).calls if n.startswith("files.")]
        assert files == [
            ("files.write", {"path": f"{box.workdir}/a/b.txt", "size": 4, "mode": None}),
            ("files.read", {"path": f"{box.workdir}/a/b.txt"}),
        ]


def test_close_kills_the_job_once_and_checks_its_stage_with_the_jobs_api() -> None:
    jobs = fake_hf_sandbox.HfApi()
    box = fake_backend(jobs_api=jobs).create(SandboxSpec())
    box.close()
    box.close()
    assert [name for name, _ in sdk_of(box).calls].count("kill") == 1
    asked = {"job_id": box.remote_id, "namespace": fake_hf_sandbox.USER}
    assert ("inspect_job", asked) in jobs.calls
    assert sdk_of(box).stage == "CANCELED"


def test_a_cancel_the_sdk_only_logged_is_retried_through_the_jobs_api(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = fake_hf_sandbox.HfApi()
    backend = fake_backend(jobs_api=jobs)
    box = backend.create(SandboxSpec())
    monkeypatch.setattr(fake_hf_sandbox.Sandbox, "cancel_failures", 1)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("error", UnstoppedSandboxWarning)
        box.close()  # kill() logs "Failed to kill sandbox" and returns; the job runs on
    assert f"Failed to kill sandbox {box.remote_id}" in caplog.text
    asked = {"job_id": box.remote_id, "namespace": fake_hf_sandbox.USER}
    assert ("cancel_job", asked) in jobs.calls
    assert sdk_of(box).stage == "CANCELED"


def test_the_namespace_is_asked_once_for_all_jobs() -> None:
    jobs = fake_hf_sandbox.HfApi()
    backend = fake_backend(jobs_api=jobs)
    for _ in range(2):
        backend.create(SandboxSpec()).close()
    assert [call for call in jobs.calls if call[0] == "whoami"] == [("whoami", {"cache": True})]
    jobs = fake_hf_sandbox.HfApi()
    backend = fake_backend(jobs_api=jobs, namespace="my-org")
    box = backend.create(SandboxSpec())
    box.close()
    assert ("whoami", {"cache": True}) not in jobs.calls
    assert sdk_of(box).calls[0][1]["namespace"] == "my-org"
