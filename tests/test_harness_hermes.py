"""Hermes Agent, for real: installed from PyPI into its own venv in the harness cache, run headless
in a local sandbox against a scripted OpenAI Chat Completions server, its requests recorded.

Set HARNESS_GYM_UPDATE_FIXTURES=1 to rewrite tests/fixtures/hermes_requests.json from this run.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from harness_gym.harnesses.hermes import HermesHarness
from support.cli_runs import PROBE, Run, ScriptedCLI, connect_targets, started
from support.recorded_requests import chat_shape, portable
from support.scripted_openai import RecordedRequest

from harness_gym.harness import Endpoint, HarnessError, load_harness
from harness_gym.sandbox.base import ExecResult
from harness_gym.sandbox.local import LocalSandbox

FIXTURE = Path(__file__).parent / "fixtures" / "hermes_requests.json"
CHAT = ("POST", "/v1/chat/completions")


CLI = ScriptedCLI(HermesHarness, prompt="Write hello into probe.txt.", timeout_s=180)


@pytest.fixture(scope="module")
def cache() -> Path:
    return CLI.installed()


@pytest.fixture(scope="module")
def runs(cache: Path) -> Iterator[dict[str, tuple[LocalSandbox, Future[Run]]]]:
    """The three Hermes runs the slow tests below look at, started together
    (`support.cli_runs`). A Hermes start is ~10 s of Python imports on one core; one after the
    other they took ~35 s."""
    with started(CLI, cache) as done:
        yield done


def test_hermes_is_found_by_its_entry_point_name() -> None:
    harness = load_harness("hermes")
    assert isinstance(harness, HermesHarness)
    assert (harness.dialect, harness.shell_tool) == ("openai-chat", "terminal")


@pytest.mark.slow
def test_hermes_runs_an_episode_against_a_scripted_openai_server(cache: Path, runs) -> None:
    box, run = runs["episode"]
    result, server = run.result()["result"], run.result()["server"]
    harness = HermesHarness()
    assert result.exit_code == 0, result.stderr
    assert box.read_file("probe.txt") == b"hello\n"
    output = harness.parse_output(result.stdout)
    assert (output.final_message, output.error) == ("done", None)

    # Probes (GET, answered 404) come before each turn; two chat calls on our /v1 route.
    calls = [(r.method, r.path) for r in server.requests]
    assert calls.count(CHAT) == 2
    assert {m for m, p in calls if (m, p) != CHAT} == {"GET"}
    assert ("GET", "/api/v1/models") in calls
    first, second = server.chat_requests()
    assert first.headers["Authorization"] == "Bearer session-key-1"
    assert first.body["stream"] is True and first.body["model"] == "policy"
    assert first.body["messages"][1] == {"role": "user", "content": "Write hello into probe.txt."}

    # The tool result comes back as a JSON string, with the tool's name.
    assert second.body["messages"][:2] == first.body["messages"]
    call_turn, tool_turn = second.body["messages"][2:]
    assert call_turn["role"] == "assistant" and call_turn["content"] == ""
    (call,) = call_turn["tool_calls"]
    assert call["function"]["name"] == "terminal"
    assert json.loads(call["function"]["arguments"]) == {"command": PROBE}
    assert (tool_turn["role"], tool_turn["name"]) == ("tool", "terminal")
    assert json.loads(tool_turn["content"])["exit_code"] == 0

    recorded = [_portable(r, box, cache) for r in server.chat_requests()]
    if os.environ.get("HARNESS_GYM_UPDATE_FIXTURES"):
        FIXTURE.write_text(json.dumps(recorded, indent=2) + "\n")
    # The same 16 tools on every host: the config pins Hermes' toolsets (with `chromium` on PATH
    # its defaults would add 13 browser tools).
    assert chat_shape(recorded) == chat_shape(json.loads(FIXTURE.read_text()))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_hermes_connects_to_nothing_but_the_base_url(runs) -> None:
    _, run = runs["strace"]
    result, server, log = run.result()["result"], run.result()["server"], run.result()["log"]
    assert result.exit_code == 0, result.stderr
    assert connect_targets(log) == {(str(server.port), "127.0.0.1")}


@pytest.mark.slow
def test_a_failed_model_call_exits_zero_but_is_reported_as_an_error(runs) -> None:
    _, run = runs["failed_call"]
    result, harness = run.result()["result"], HermesHarness()
    output = harness.parse_output(result.stdout)
    assert result.exit_code == 0
    assert output.error and "404" in output.error
    assert output.final_message is None


def test_the_config_points_hermes_at_the_endpoint() -> None:
    endpoint = Endpoint("http://127.0.0.1:8123/", "se:ss #1", model="m", context_length=1000)
    text = HermesHarness().config_files(endpoint)[".hermes/config.yaml"]
    assert text == (
        "model:\n"
        '  provider: "custom"\n'
        '  base_url: "http://127.0.0.1:8123/v1"\n'
        '  api_key: "se:ss #1"\n'
        '  default: "m"\n'
        "  context_length: 1000\n"
        "  max_tokens: 4096\n"
        "platform_toolsets:\n"
        '  cli: ["clarify", "code_execution", "delegation", "file", "memory", "session_search", '
        '"skills", "terminal", "todo", "vision"]\n'
    )


def test_the_prompt_is_one_argument_whatever_it_starts_with() -> None:
    endpoint = Endpoint("http://127.0.0.1:9", "key")
    assert HermesHarness().args(endpoint, "--help me") == ["--oneshot=--help me"]
    assert HermesHarness().args(endpoint, "fix it") == ["--oneshot=fix it"]
    assert HermesHarness().stdin("fix it") is None


def test_a_prompt_over_the_argument_limit_is_refused_with_the_reason() -> None:
    with pytest.raises(HarnessError, match="caps at"):
        HermesHarness().args(Endpoint("http://127.0.0.1:9", "key"), "x" * 140_000)


def test_the_reason_hermes_gives_on_stderr_is_the_error() -> None:
    stderr = ("some log line\nhermes -z: agent failed: Model policy has a context window of "
              "8,192 tokens, which is below the minimum 64,000 required by Hermes Agent.\n")
    result = ExecResult(exit_code=1, stdout="", stderr=stderr)
    output = HermesHarness().read_output(result)
    assert output.error is not None and "below the minimum 64,000" in output.error
    assert output.stderr_tail == stderr


def _portable(request: RecordedRequest, box: LocalSandbox, cache: Path) -> dict[str, Any]:
    literals = {box.workdir: "<workdir>", box.home: "<home>", str(cache): "<harness-cache>"}
    return portable(request, literals, [
        (r"Conversation started: [^\\]+", "Conversation started: <date>"),
    ])
