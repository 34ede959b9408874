"""Codex CLI, Gemini CLI, Qwen Code and mini-swe-agent, for real: each solves a built-in task through our proxy
with the oracle (the patch goes through the CLI's own shell tool: Codex's `exec_command`, the
others' `run_shell_command` or `bash`) on bwrap, and fails it with `oracle:noop`; plus their config as
data.

The episodes run in a child process under `unshare --net` where that is possible (root), so
neither CLI can have reached anything but loopback (`test_harness_episodes.isolated_network`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib

import pytest
from support.parallel import each_in_threads, in_threads, result_of, selected_params
from test_harness_episodes import EPISODES, TASKS, changed_lines, isolated_network

from harness_gym.harness import Endpoint, load_harness
from harness_gym.harnesses.codex import CodexHarness
from harness_gym.harnesses.gemini_cli import MODEL_TOKEN_LIMIT, GeminiCliHarness
from harness_gym.harnesses.qwen_code import QwenCodeHarness

TASK = "harness-gym__routes-61"
ENDPOINT = Endpoint("http://127.0.0.1:9", 'key"with\\quotes', model="pol\"icy",
                    context_length=32_768, max_tokens=2_048)


def test_both_are_registered_with_their_dialect_and_shell_tool() -> None:
    assert (load_harness("codex").dialect, load_harness("codex").shell_tool) == (
        "openai-responses", "exec_command")
    gemini = load_harness("gemini-cli")
    assert (gemini.dialect, gemini.shell_tool) == ("gemini", "run_shell_command")


def test_codex_config_points_at_the_proxy_offline_with_the_window() -> None:
    harness = CodexHarness()
    config = tomllib.loads(harness.config_files(ENDPOINT)[".codex/config.toml"])
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:9/v1"
    assert provider["wire_api"] == "responses"
    assert harness.endpoint_env(ENDPOINT) == {provider["env_key"]: ENDPOINT.api_key}
    assert config["model"] == ENDPOINT.model  # quoted safely
    assert config["model_context_window"] == 32_768
    assert config["model_auto_compact_token_limit"] == 24_576
    assert config["check_for_update_on_startup"] is False
    assert not any(config["features"].values()) and "plugins" in config["features"]
    assert harness.args(ENDPOINT, "-x")[-1] == "-"  # the prompt comes on stdin
    assert harness.stdin("-x @f") == "-x @f"


def test_gemini_cli_settings_carry_the_key_route_limits_and_offline_switches() -> None:
    harness = GeminiCliHarness()
    settings = json.loads(harness.config_files(ENDPOINT)[".gemini/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["telemetry"]["enabled"] is False
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    threshold = settings["model"]["compressionThreshold"]
    assert threshold * MODEL_TOKEN_LIMIT == pytest.approx(32_768 * 3 / 4, rel=1e-4)
    (override,) = settings["modelConfigs"]["customOverrides"]
    assert override["match"] == {"model": ENDPOINT.model}
    assert override["modelConfig"]["generateContentConfig"]["maxOutputTokens"] == 2_048
    assert harness.endpoint_env(ENDPOINT) == {"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9",
                                              "GEMINI_API_KEY": ENDPOINT.api_key}


def test_qwen_code_settings_carry_the_window_and_the_output_cap() -> None:
    harness = QwenCodeHarness()
    settings = json.loads(harness.config_files(ENDPOINT)[".qwen/settings.json"])
    generation = settings["model"]["generationConfig"]
    assert generation == {"contextWindowSize": 32_768, "samplingParams": {"max_tokens": 2_048}}
    assert settings["telemetry"]["enabled"] is False
    assert harness.endpoint_env(ENDPOINT)["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    failed = harness.parse_output(json.dumps({"type": "result", "is_error": True,
                                              "error": {"message": "[API Error: 404]"}}))
    assert failed.error == "[API Error: 404]"


def test_output_parsers_read_the_final_message_calls_and_errors() -> None:
    codex = CodexHarness().parse_output("\n".join(json.dumps(e) for e in [
        {"type": "thread.started"}, {"type": "item.completed", "item": {
            "type": "command_execution", "command": "ls"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "fixed"}}]))
    assert (codex.final_message, codex.n_tool_calls, codex.error) == ("fixed", 1, None)
    failed = CodexHarness().parse_output(json.dumps(
        {"type": "turn.failed", "error": {"message": "unexpected status 400"}}))
    assert failed.error == "unexpected status 400"
    gemini = GeminiCliHarness().parse_output(
        "notice\n" + json.dumps({"response": "fixed", "stats": {"tools": {"totalCalls": 2}}}))
    assert (gemini.final_message, gemini.n_tool_calls, gemini.error) == ("fixed", 2, None)
    assert GeminiCliHarness().parse_output(json.dumps(
        {"error": {"message": "quota"}})).error == "quota"
    assert GeminiCliHarness().parse_output("not json").final_message is None


def run_episodes(harness: str) -> tuple[list[dict], bool]:
    prefix = isolated_network()
    script = EPISODES.replace('sandbox="local"', 'sandbox="bwrap"')
    assert script != EPISODES
    done = subprocess.run([*(prefix or []), sys.executable, "-c", script, harness, TASK],
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), prefix is not None


def installed_episodes(harness: str) -> tuple[list[dict], bool]:
    load_harness(harness).install()
    return run_episodes(harness)


@pytest.fixture(scope="module")
def bwrap_episodes(request: pytest.FixtureRequest
                   ) -> dict[str, tuple[list[dict], bool] | Exception]:
    """harness -> its `run_episodes`, for the CLIs whose test below is selected, two drivers at
    a time (`support.parallel`: each driver its own process, network namespace, envs and
    sandboxes); a driver's error is raised by its CLI's test."""
    if shutil.which("npm") is None or shutil.which("bwrap") is None:
        pytest.skip("needs npm (the CLIs install with it) and bubblewrap")
    test = test_the_cli_solves_a_builtin_task_on_bwrap_with_the_oracle_and_fails_with_noop
    names = selected_params(request, test, "harness")
    return dict(zip(names, each_in_threads(installed_episodes, names, 2)))


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("harness", ["codex", "gemini-cli", "qwen-code", "mini-swe-agent"])
def test_the_cli_solves_a_builtin_task_on_bwrap_with_the_oracle_and_fails_with_noop(
        harness, bwrap_episodes):
    infos, offline = result_of(bwrap_episodes[harness])
    solved, failed = infos
    assert (solved["engine"], failed["engine"]) == ("oracle", "oracle:noop")
    assert solved["outcome"] == "passed", (solved["error"], solved["harness_output"]["tail"])
    task = TASKS[TASK]
    assert all(solved["tests"][t] == "PASSED" for t in task.FAIL_TO_PASS)
    assert changed_lines(solved["patch"]) == changed_lines(task.patch)
    # Through the CLI's own shell tool; mini-swe-agent's episode ends on a second call, its
    # submit command.
    assert solved["n_tool_calls"] == (2 if harness == "mini-swe-agent" else 1)
    assert [s["role"] for s in solved["trace"]] == ["agent"]  # the echoed turn kept one segment
    assert failed["outcome"] == "failed" and failed["reward"] == 0.0
    if not offline:
        pytest.skip("episodes passed, but on the host network: unshare --net needs root")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_conformance_check_passes_both_gemini_clis():
    """`harness-gym harnesses --check` on real CLIs: Gemini CLI keeps every promise, and so does
    Qwen Code with its input hook (without it, 0.24.4 puts a space before the probe's
    "@notes.txt": `test_qwen_code_without_its_hook_alters_the_task_text`)."""
    if shutil.which("npm") is None:
        pytest.skip("the CLIs install with npm")
    from harness_gym.harness_check import check_harness

    gemini, qwen = load_harness("gemini-cli"), load_harness("qwen-code")
    gemini.install()
    qwen.install()
    # Side by side (`support.parallel`): each check is its own proxy, sandbox and CLI run.
    problems = in_threads(lambda share: [check_harness(h) for h in share], [gemini, qwen], 2)
    assert problems == [[], []], problems


# Starts like one of Qwen Code's slash commands, holds @-mentions after no space, a flag it
# strips from `/model`'s "verbatim" prompts, and blank lines where stdin and --prompt meet.
QWEN_HOSTILE = "/help\n\n@notes.txt is text (@README.md, too)\n\n  --global \n\n"


def test_qwen_code_splits_the_task_where_it_joins_stdin_and_the_prompt_argument() -> None:
    harness = QwenCodeHarness()
    for prompt in (QWEN_HOSTILE, "one line", "\n\nlead", "tail\n\n", "a\n\n\n"):
        stdin, argument = harness.stdin(prompt), harness.args(ENDPOINT, prompt)[-1]
        assert argument.startswith("--prompt=")
        rest = argument[len("--prompt="):]
        # What Qwen Code's `main` does: stdin (when non-empty) + "\n\n" + the --prompt text.
        assert (f"{stdin}\n\n{rest}" if stdin else rest) == prompt and rest


def test_qwen_codes_installed_cli_still_has_the_line_its_hook_rewrites() -> None:
    """A cheap drift check: the hook fails the CLI's start if the line is gone; this says so
    without running it."""
    harness = load_harness("qwen-code")
    if not harness.is_installed():
        pytest.skip("qwen-code is not installed (harness-gym harnesses --install)")
    from harness_gym.harnesses.qwen_code import RUN_LINE, RUN_MARKER

    chunks = harness.install_dir() / "node_modules/@qwen-code/qwen-code/chunks"
    holding = [p.read_text() for p in chunks.glob("*.js") if RUN_MARKER in p.read_text()]
    assert len(holding) == 1 and holding[0].count(RUN_LINE) == 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_qwen_code_shows_a_task_that_looks_like_a_command_verbatim_only_with_its_hook() -> None:
    if shutil.which("npm") is None:
        pytest.skip("the CLIs install with npm")
    from support.fidelity import run_harness, scripted

    harness = load_harness("qwen-code")
    harness.install()

    class Unhooked(QwenCodeHarness):
        env = {k: v for k, v in QwenCodeHarness.env.items() if k != "NODE_OPTIONS"}

    # The two runs side by side (`support.parallel`), each with its own engine and proxy.
    engines = [scripted(lambda _: "Done."), scripted(lambda _: "Done.")]
    run, bare = in_threads(lambda share: [run_harness(h, e, QWEN_HOSTILE) for h, e in share],
                           [(harness, engines[0]), (Unhooked(), engines[1])], 2)
    assert f"</system-reminder>{QWEN_HOSTILE}<|im_end|>" in run.prompts(engines[0])[0]
    # Without it, "/help" is its own command: it prints its help and never asks the model.
    assert bare.trace.n_llm_calls == 0 and "/help" in bare.result.stdout, bare.result.stdout[-500:]


def test_mini_swe_agents_installed_instance_template_still_starts_with_the_task_line() -> None:
    """The launcher moves the rules after `TASK_LINE` into the system template, and stops if
    mini.yaml changed; this says so without running it."""
    import yaml

    from harness_gym.harnesses.mini_swe_agent import TASK_LINE

    harness = load_harness("mini-swe-agent")
    if not harness.is_installed():
        pytest.skip("mini-swe-agent is not installed (harness-gym harnesses --install)")
    (config,) = harness.install_dir().glob(
        "lib/python3*/site-packages/minisweagent/config/mini.yaml")
    template = yaml.safe_load(config.read_text())["agent"]["instance_template"]
    assert template.startswith(TASK_LINE) and "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in template
