"""Claude Code, for real: installed from npm into the harness cache, run headless in a local sandbox
against a scripted Anthropic Messages server, its requests recorded.

Set HARNESS_GYM_UPDATE_FIXTURES=1 to rewrite tests/fixtures/claude_code_requests.json (the
request pair of one episode, volatile values replaced) from this run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from harness_gym.harness import Endpoint, load_harness
from harness_gym.harnesses.claude_code import ClaudeCodeHarness
from harness_gym.sandbox.local import LocalSandbox
from support.cli_runs import PROBE, Run, ScriptedCLI, connect_targets, started
from support.scripted_openai import RecordedRequest

FIXTURE = Path(__file__).parent / "fixtures" / "claude_code_requests.json"

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="Claude Code installs with npm")


CLI = ScriptedCLI(ClaudeCodeHarness, prompt="Write hello into probe.txt.",
                  endpoint={"max_tokens": 1024})


@pytest.fixture(scope="module")
def cache() -> Path:
    return CLI.installed()


@pytest.fixture(scope="module")
def runs(cache: Path) -> Iterator[dict[str, tuple[LocalSandbox, Future[Run]]]]:
    """The three Claude Code runs the tests below look at, started together
    (`support.cli_runs`). Each is mostly a Claude Code start-up; together they take about the
    time of one and a half."""
    with started(CLI, cache) as done:
        yield done


def test_claude_code_is_found_by_its_entry_point_name() -> None:
    harness = load_harness("claude-code")
    assert isinstance(harness, ClaudeCodeHarness)
    assert (harness.dialect, harness.shell_tool) == ("anthropic-messages", "Bash")


def test_claude_code_runs_an_episode_against_a_scripted_messages_server(cache: Path, runs) -> None:
    box, run = runs["episode"]
    result, server = run.result()["result"], run.result()["server"]
    harness = ClaudeCodeHarness()
    assert result.exit_code == 0, result.stderr
    assert box.read_file("probe.txt") == b"hello\n"
    output = harness.parse_output(result.stdout)
    assert (output.final_message, output.n_tool_calls, output.error) == ("done", 1, None)

    # Only the Messages route (a HEAD / would be answered too; this version sends none).
    calls = [(r.method, r.path) for r in server.requests if (r.method, r.path) != ("HEAD", "/")]
    assert calls == [("POST", "/v1/messages?beta=true")] * 2
    first, second = server.message_requests()
    assert first.headers["x-api-key"] == "session-key-1"
    assert first.body["stream"] is True
    assert (first.body["model"], first.body["max_tokens"]) == ("policy", 1024)
    assert "Bash" in [tool["name"] for tool in first.body["tools"]]
    assert first.body["messages"][0]["content"][-1]["text"] == "Write hello into probe.txt."

    # The second request replays the first, then the parsed tool_use and its tool_result.
    assert second.body["messages"][0] == first.body["messages"][0]
    call_turn, result_turn = second.body["messages"][-2:]
    (call,) = call_turn["content"]
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "Bash", {"command": PROBE})
    (tool_result,) = result_turn["content"]
    assert (tool_result["type"], tool_result["tool_use_id"]) == ("tool_result", call["id"])

    recorded = [_portable(r, box, cache) for r in (first, second)]
    if os.environ.get("HARNESS_GYM_UPDATE_FIXTURES"):
        FIXTURE.write_text(json.dumps(recorded, indent=2) + "\n")
    assert _shape(recorded) == _shape(json.loads(FIXTURE.read_text()))


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_claude_code_connects_to_nothing_but_the_base_url(runs) -> None:
    _, run = runs["strace"]
    result, server, log = run.result()["result"], run.result()["server"], run.result()["log"]
    assert result.exit_code == 0, result.stderr
    assert connect_targets(log) == {(str(server.port), "127.0.0.1")}


def test_a_failed_model_call_is_reported_as_an_error(runs) -> None:
    _, run = runs["failed_call"]
    result, harness = run.result()["result"], ClaudeCodeHarness()
    output = harness.parse_output(result.stdout)
    assert output.error, result.stdout[-2000:]
    assert output.final_message is None


def test_the_environment_points_claude_code_at_the_endpoint() -> None:
    endpoint = Endpoint("http://127.0.0.1:8123/", "sess", model="m", max_tokens=77)
    env = ClaudeCodeHarness().endpoint_env(endpoint)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"
    assert (env["ANTHROPIC_API_KEY"], env["ANTHROPIC_MODEL"]) == ("sess", "m")
    assert (env["ANTHROPIC_DEFAULT_HAIKU_MODEL"], env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == ("m", "77")
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(endpoint.context_length)


def test_the_output_parser_reads_the_result_event() -> None:
    events = [
        {"type": "system", "subtype": "init"},
        {"type": "assistant", "message": {"content": [{"type": "tool_use", "name": "Bash"}]}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "ok"},
    ]
    output = ClaudeCodeHarness().parse_output("\n".join(map(json.dumps, events)))
    assert (output.final_message, output.n_tool_calls, output.error) == ("ok", 1, None)
    failed = {"type": "result", "is_error": True, "result": "API Error: 404"}
    output = ClaudeCodeHarness().parse_output(json.dumps(failed))
    assert (output.final_message, output.error) == (None, "API Error: 404")


def _portable(request: RecordedRequest, box: LocalSandbox, cache: Path) -> dict[str, Any]:
    """A recorded request with this run's paths, ids, port and date replaced by placeholders."""
    text = json.dumps({"method": request.method, "path": request.path,
                       "headers": request.headers, "body": request.body})
    root = str(Path(box.workdir).parent)
    text = text.replace(box.workdir, "<workdir>").replace(box.home, "<home>")
    text = text.replace(root.replace("/", "-"), "<root>").replace(str(cache), "<harness-cache>")
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", text)
    text = re.sub(r"[0-9a-f]{64}", "<device-id>", text)
    text = re.sub(r"Today's date is \d{4}-\d\d-\d\d", "Today's date is <date>", text)
    text = re.sub(r"OS Version: [^\\]+", "OS Version: <os>", text)
    return json.loads(text)


def _shape(requests: list[dict[str, Any]]) -> list[Any]:
    """What the proxy depends on: fields, roles, block types, tool names; not the text."""

    def blocks(content: Any) -> Any:
        return [b["type"] for b in content] if isinstance(content, list) else "str"

    return [
        {
            "path": r["path"],
            "headers": sorted(k.lower() for k in r["headers"]),
            "fields": sorted(r["body"]),
            "messages": [(m["role"], blocks(m["content"])) for m in r["body"]["messages"]],
            "tools": [t["name"] for t in r["body"]["tools"]],
        }
        for r in requests
    ]
