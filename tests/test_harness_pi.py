"""Pi, for real: installed from npm into a fresh cache, run headless in a local sandbox against a
scripted OpenAI Chat Completions server, its requests recorded.

Set HARNESS_GYM_UPDATE_FIXTURES=1 to rewrite tests/fixtures/pi_requests.json from this run (the
proxy is built against those shapes; the test checks that Pi still sends them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_gym.harnesses.pi import PiHarness
from support.cli_runs import connect_targets
from support.recorded_requests import chat_shape, portable
from support.scripted_openai import RecordedRequest, ScriptedChatServer, shell_then_done

from harness_gym.harness import Endpoint, HarnessError, load_harness
from harness_gym.sandbox import SandboxSpec
from harness_gym.sandbox.local import LocalSandbox, LocalSandboxBackend

FIXTURE = Path(__file__).parent / "fixtures" / "pi_requests.json"
PROBE = "echo hello > probe.txt"

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="Pi installs with npm")


@pytest.fixture(scope="module")
def install_log(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two threads install Pi into one fresh cache at the same moment."""
    cache = tmp_path_factory.mktemp("harness-cache")
    harness = PiHarness()
    messages: list[str] = []
    results: list[Path | BaseException] = []
    barrier = threading.Barrier(2)

    def install() -> None:
        barrier.wait()
        try:
            results.append(harness.install(cache, progress=messages.append))
        except BaseException as exc:  # reported by the test, not lost in the thread
            results.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=install) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"cache": cache, "messages": messages, "results": results,
            "seconds": time.monotonic() - started}


@pytest.fixture
def pi_cache(install_log: dict[str, Any]) -> Path:
    if not PiHarness().is_installed(install_log["cache"]):
        pytest.fail(f"Pi did not install: {install_log['results']}")
    return install_log["cache"]


@pytest.fixture
def box() -> Iterator[LocalSandbox]:
    with LocalSandboxBackend().create(SandboxSpec()) as sandbox:
        yield sandbox


def test_pi_is_found_by_its_entry_point_name() -> None:
    harness = load_harness("pi")
    assert isinstance(harness, PiHarness)
    assert (harness.dialect, harness.shell_tool) == ("openai-chat", "bash")


def test_two_concurrent_installs_install_once_into_the_cache(install_log: dict[str, Any]) -> None:
    cache = install_log["cache"]
    assert install_log["results"] == [cache / "pi-0.73.1"] * 2
    assert sum(m.startswith("installing") for m in install_log["messages"]) == 1
    assert PiHarness().executable(cache).is_file()
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".pi-0.73.1.lock")] == [
        "pi-0.73.1"
    ]


def test_a_second_install_is_a_fast_no_op(pi_cache: Path) -> None:
    messages: list[str] = []
    started = time.monotonic()
    PiHarness().install(pi_cache, progress=messages.append)
    # A marker-file check, no npm: no progress message, and well under the seconds a real
    # install takes. Not 0.1 s: a loaded 2-core machine can keep a runnable process off the
    # CPU for longer than that.
    assert messages == []
    assert time.monotonic() - started < 2.0


def test_preparing_before_installing_says_what_to_do(box: LocalSandbox, tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="call install"):
        PiHarness().prepare(box, Endpoint("http://127.0.0.1:9", "key"), "hi", tmp_path)


def test_pi_runs_an_episode_against_a_scripted_openai_server(
    pi_cache: Path, box: LocalSandbox
) -> None:
    harness = PiHarness()
    with ScriptedChatServer(shell_then_done("bash", PROBE)) as server:
        endpoint = Endpoint(server.base_url, api_key="session-key-1", model="policy")
        job = harness.launch(box, endpoint, "Write hello into probe.txt.", cache_dir=pi_cache)
        result = job.wait(timeout=120)

    assert result.exit_code == 0, result.stderr
    assert box.read_file("probe.txt") == b"hello\n"
    output = harness.parse_output(result.stdout)
    assert (output.final_message, output.n_tool_calls, output.error) == ("done", 1, None)

    # Pi makes no other requests (no probes, no model list), and talks to our /v1 route.
    assert [(r.method, r.path) for r in server.requests] == [("POST", "/v1/chat/completions")] * 2
    first, second = server.requests
    assert first.headers["authorization"] == "Bearer session-key-1"
    assert "bash" in [tool["function"]["name"] for tool in first.body["tools"]]
    assert first.body["stream"] is True
    assert first.body["messages"][1]["content"] == [
        {"type": "text", "text": "Write hello into probe.txt."}
    ]

    # The second request replays the first turn, then carries the tool's result.
    assert second.body["messages"][:2] == first.body["messages"]
    call_turn, tool_turn = second.body["messages"][2:]
    assert call_turn["role"] == "assistant" and call_turn["content"] is None
    (call,) = call_turn["tool_calls"]
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": PROBE}
    assert tool_turn["role"] == "tool" and tool_turn["tool_call_id"] == call["id"]

    recorded = [_portable(r, box, pi_cache) for r in server.requests]
    if os.environ.get("HARNESS_GYM_UPDATE_FIXTURES"):
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(json.dumps(recorded, indent=2) + "\n")
    assert chat_shape(recorded) == chat_shape(json.loads(FIXTURE.read_text()))


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_pi_connects_to_nothing_but_the_base_url(pi_cache: Path, box: LocalSandbox) -> None:
    harness = PiHarness()
    log = box.root / "connect.log"
    with ScriptedChatServer(shell_then_done("bash", PROBE)) as server:
        plan = harness.prepare(box, Endpoint(server.base_url, "key"), "hi", cache_dir=pi_cache)
        argv = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(log), *plan.argv]
        assert box.start(argv, env=plan.env).wait(timeout=120).exit_code == 0
    assert connect_targets(log.read_text()) == {(str(server.port), "127.0.0.1")}


def test_a_failed_model_call_exits_zero_but_is_reported_as_an_error(
    pi_cache: Path, box: LocalSandbox
) -> None:
    """Pi exits 0 even when every model call failed: the env must read `error`."""
    harness = PiHarness()
    with ScriptedChatServer(shell_then_done("bash", PROBE)) as server:
        endpoint = Endpoint(server.base_url + "/missing", "key")  # every call gets a 404
        result = harness.launch(box, endpoint, "hi", cache_dir=pi_cache).wait(timeout=120)
    output = harness.parse_output(result.stdout)
    assert result.exit_code == 0
    assert output.error and "404" in output.error
    assert output.final_message is None


def test_a_timed_out_episode_leaves_no_tool_command_running(
    pi_cache: Path, box: LocalSandbox
) -> None:
    """Pi runs each bash call in a new session, outside its process group: killing the group
    alone left the agent's command running."""
    seconds = f"1000.{os.getpid()}{int(time.time() * 1000) % 10**6}"
    harness = PiHarness()
    with ScriptedChatServer(shell_then_done("bash", f"sleep {seconds}")) as server:
        job = harness.launch(box, Endpoint(server.base_url, "key"), "hi", cache_dir=pi_cache)
        deadline = time.monotonic() + 60
        while not _alive(seconds) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(seconds), "Pi never ran the tool call"
        result = job.wait(timeout=0.1)
    assert result.timed_out
    assert _alive(seconds) == []


def _alive(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("prompt", ["--help me", "@file fix it", "fix it", "-x \n\t ",
                                    " lead", "\n-x", "x\ufeff", ""])
def test_stdin_and_the_message_argument_join_back_into_the_prompt(prompt: str) -> None:
    """Pi trims stdin and appends the first positional message without a separator; a message
    starting with "-" or "@" would be a flag or a file."""
    harness, endpoint = PiHarness(), Endpoint("http://127.0.0.1:9", "key")
    base = harness.args(endpoint, "x")
    stdin, args = harness.stdin(prompt), harness.args(endpoint, prompt)
    message = args[len(base):]
    assert len(message) <= 1 and not (message and message[0][:1] in ("-", "@"))
    js_trimmed = (stdin or "").strip("\t\n\v\f\r \ufeff")
    assert stdin is None or js_trimmed == stdin
    assert (stdin or "") + "".join(message) == prompt


def test_pi_reserves_the_output_cap_for_compaction_not_16k() -> None:
    endpoint = Endpoint("http://x", "k", context_length=8192, max_tokens=2048)
    settings = json.loads(PiHarness().config_files(endpoint)[".pi/agent/settings.json"])
    assert settings == {"compaction": {"reserveTokens": 2048, "keepRecentTokens": 2048}}


def test_models_json_points_pi_at_the_endpoint() -> None:
    endpoint = Endpoint("http://127.0.0.1:8123/", "sess", model="m", context_length=1000)
    config = json.loads(PiHarness().config_files(endpoint)[".pi/agent/models.json"])
    provider = config["providers"]["harness-gym"]
    assert provider["baseUrl"] == "http://127.0.0.1:8123/v1"
    assert (provider["api"], provider["apiKey"]) == ("openai-completions", "sess")
    assert provider["models"][0]["id"] == "m"
    assert provider["models"][0]["contextWindow"] == 1000
    assert provider["models"][0]["maxTokens"] == endpoint.max_tokens


def test_the_output_parser_skips_lines_that_are_not_json() -> None:
    stdout = "fd not found. Offline mode enabled, skipping download.\n" + "\n".join(
        json.dumps(event)
        for event in [
            {"type": "agent_start"},
            {"type": "tool_execution_start", "toolName": "bash"},
            {"type": "message_end", "message": {"role": "assistant",
                                                "content": [{"type": "text", "text": "ok"}]}},
        ]
    )
    output = PiHarness().parse_output(stdout)
    assert (output.final_message, output.n_tool_calls, output.error) == ("ok", 1, None)
    assert PiHarness().parse_output("no events at all").n_tool_calls is None


def _portable(request: RecordedRequest, box: LocalSandbox, cache: Path) -> dict[str, Any]:
    literals = {box.workdir: "<workdir>", str(cache): "<harness-cache>"}
    return portable(request, literals, [
        (r"Current date: \d{4}-\d\d-\d\d", "Current date: <date>"),
    ])
