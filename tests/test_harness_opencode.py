"""OpenCode, for real: installed from npm into the harness cache, run headless in a local sandbox
against a scripted OpenAI Chat Completions server, its requests recorded.

Set HARNESS_GYM_UPDATE_FIXTURES=1 to rewrite tests/fixtures/opencode_requests.json from this run.
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
from harness_gym.harnesses.opencode import OpenCodeHarness
from support.cli_runs import PROBE, Run, ScriptedCLI, connect_targets, started
from support.recorded_requests import chat_shape, portable
from support.scripted_openai import RecordedRequest

from harness_gym.harness import Endpoint, load_harness
from harness_gym.sandbox.local import LocalSandbox

FIXTURE = Path(__file__).parent / "fixtures" / "opencode_requests.json"
# Double spaces, a newline, a quote, a number: OpenCode must get it back byte for byte.
PROMPT = 'Write hello  into probe.txt.\n"quoted" 2'

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="OpenCode installs with npm")


CLI = ScriptedCLI(OpenCodeHarness, prompt=PROMPT)


@pytest.fixture(scope="module")
def cache() -> Path:
    return CLI.installed()


@pytest.fixture(scope="module")
def runs(cache: Path) -> Iterator[dict[str, tuple[LocalSandbox, Future[Run]]]]:
    """The three OpenCode runs the tests below look at, started together (`support.cli_runs`).
    Each is mostly an OpenCode start-up; together they take about the time of one and a half."""
    with started(CLI, cache) as done:
        yield done


def test_opencode_is_found_by_its_entry_point_name() -> None:
    harness = load_harness("opencode")
    assert isinstance(harness, OpenCodeHarness)
    assert (harness.dialect, harness.shell_tool) == ("openai-chat", "bash")


@pytest.mark.slow
def test_opencode_runs_an_episode_against_a_scripted_openai_server(cache: Path, runs) -> None:
    box, run = runs["episode"]
    result, server = run.result()["result"], run.result()["server"]
    harness = OpenCodeHarness()
    assert result.exit_code == 0, result.stderr
    assert box.read_file("probe.txt") == b"hello\n"
    output = harness.parse_output(result.stdout)
    assert (output.final_message, output.n_tool_calls, output.error) == ("done", 1, None)

    # No probes, no model list: only our /v1 route, and the prompt arrives unquoted.
    assert [(r.method, r.path) for r in server.requests] == [("POST", "/v1/chat/completions")] * 2
    first, second = server.requests
    assert first.headers["Authorization"] == "Bearer session-key-1"
    assert first.body["stream"] is True and first.body["model"] == "policy"
    assert first.body["messages"][1] == {"role": "user", "content": PROMPT}

    # The second request replays the first, then the tool call (content "") and its result.
    assert second.body["messages"][:2] == first.body["messages"]
    call_turn, tool_turn = second.body["messages"][2:]
    assert call_turn["role"] == "assistant" and call_turn["content"] == ""
    (call,) = call_turn["tool_calls"]
    assert call["function"] == {"name": "bash", "arguments": json.dumps({"command": PROBE},
                                                                        separators=(",", ":"))}
    assert tool_turn == {"role": "tool", "tool_call_id": call["id"], "content": "(no output)"}

    # It installed nothing: no npm cache in its HOME.
    assert not (Path(box.home) / ".npm").exists()

    recorded = [_portable(r, box, cache) for r in server.requests]
    if os.environ.get("HARNESS_GYM_UPDATE_FIXTURES"):
        FIXTURE.write_text(json.dumps(recorded, indent=2) + "\n")
    assert chat_shape(recorded) == chat_shape(json.loads(FIXTURE.read_text()))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_opencode_connects_to_nothing_but_the_base_url(runs) -> None:
    _, run = runs["strace"]
    result, server, log = run.result()["result"], run.result()["server"], run.result()["log"]
    assert result.exit_code == 0, result.stderr
    assert connect_targets(log) == {(str(server.port), "127.0.0.1")}


def test_a_failed_model_call_is_reported_as_an_error(runs) -> None:
    _, run = runs["failed_call"]
    result, harness = run.result()["result"], OpenCodeHarness()
    output = harness.parse_output(result.stdout)
    assert output.error, result.stdout
    assert output.final_message is None


def test_the_prompt_goes_on_stdin_and_never_in_an_argument() -> None:
    """`opencode run` quotes and escapes any message argument holding a space."""
    endpoint, prompt = Endpoint("http://127.0.0.1:9", "key"), 'run it -x "now"'
    assert OpenCodeHarness().args(endpoint, prompt)[-1] == "harness-gym/policy"
    assert OpenCodeHarness().stdin(prompt) == prompt


def test_a_synthetic_continue_is_not_the_final_message() -> None:
    """After a compaction OpenCode adds its own user turn, printed as a `text` event."""
    said = {"type": "text", "part": {"type": "text", "text": "I fixed it."}}
    synthetic = {"type": "text", "part": {
        "type": "text", "synthetic": True, "metadata": {"compaction_continue": True},
        "text": "Continue if you have next steps, or stop and ask for clarification if you "
                "are unsure how to proceed."}}
    output = OpenCodeHarness().parse_output("\n".join(map(json.dumps, [said, synthetic])))
    assert output.final_message == "I fixed it."


def test_the_config_points_opencode_at_the_endpoint() -> None:
    endpoint = Endpoint("http://127.0.0.1:8123/", "sess", model="m", context_length=1000)
    files = OpenCodeHarness().config_files(endpoint)
    config = json.loads(files[".config/opencode/opencode.json"])
    provider = config["provider"]["harness-gym"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://127.0.0.1:8123/v1", "apiKey": "sess"}
    assert provider["models"]["m"]["limit"] == {"context": 1000, "output": endpoint.max_tokens}
    assert (config["model"], config["permission"]) == ("harness-gym/m", "allow")


def _portable(request: RecordedRequest, box: LocalSandbox, cache: Path) -> dict[str, Any]:
    literals = {
        box.workdir: "<workdir>",
        str(box.root): "<root>",
        str(cache): "<harness-cache>",
    }
    return portable(request, literals, [
        (r"ses_[0-9A-Za-z]+", "<session>"),
        (r"Today's date: [^\\]+", "Today's date: <date>"),
    ])
