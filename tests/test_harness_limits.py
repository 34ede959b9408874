"""The CLIs know the model's limits, and a CLI that cannot work in the model's window is an
`infra_error`, said at once, never a failure that enters the reward.

SmolLM2-135M's limits (8,192 tokens of context) are the case: Pi's first request is ~1.5k of
its tokens, OpenCode's 7.8k, Hermes' 11.6k (and Hermes refuses any window under 64,000), Claude
Code's 12.4k. The policy is a `ScriptedEngine` in SmolLM2's real tokenizer reporting the window
under test (no scoring model: logprobs are not looked at); `test_pi_with_the_real_smollm2_*`
runs the real model.
"""

from __future__ import annotations

import json
import shutil
import time

import gymnasium as gym
import pytest
from support.fidelity import HarnessRun, run_harness, scripted
from support.parallel import each_in_threads, result_of, selected_params

import harness_gym  # noqa: F401  (registers HarnessSWE-v0)
from harness_gym.config import EpisodeConfigError
from harness_gym.engines.agent_tools import AgentTools, tool_call_text
from harness_gym.engines.oracle import SUBMIT_COMMAND
from harness_gym.harness import load_harness
from harness_gym.harnesses.aider import AiderHarness
from harness_gym.harnesses.hermes import HermesHarness
from harness_gym.harnesses.opencode import OpenCodeHarness
from harness_gym.proxy.model_call import ProxySettings

pytestmark = [
    pytest.mark.skipif(shutil.which("npm") is None, reason="the CLIs install with npm"),
    pytest.mark.timeout(1200),
]

SMOLLM2_CONTEXT = 8_192
TASK = "harness-gym__routes-61"


def tool_turns(shell: str, turns: int):
    """A script: `turns` calls to the shell tool (`shell`, its command parameter as the prompt's
    tool list says: Codex's takes `cmd`), then a final answer (mini-swe-agent's: its submit
    command)."""

    def script(prompt: str) -> str:
        done = prompt.count("</tool_response>")
        tools = AgentTools.from_prompt(prompt)
        if done >= turns and SUBMIT_COMMAND in prompt:
            return f"All done.\n{tool_call_text(tools.shell_call(SUBMIT_COMMAND))}"
        if done >= turns:
            return "All done."
        assert tools.shell == shell, tools
        return f"Step {done}.\n{tool_call_text(tools.shell_call(f'echo {done}'))}"

    return script


def step_once(harness, engine, **settings):
    env = gym.make("HarnessSWE-v0", harness=harness, engine=engine, sandbox="local",
                   progress=False, **settings)
    try:
        env.reset(options={"task_id": TASK})
        started = time.monotonic()
        _, reward, _, _, info = env.step(None)
        return reward, info, time.monotonic() - started
    finally:
        env.close()


@pytest.mark.parametrize("cli", ["hermes", "claude-code", "opencode", "codex", "gemini-cli",
                                 "qwen-code"])
def test_a_cli_that_needs_more_context_than_smollm2_has_is_refused_at_make(cli: str):
    engine = scripted(lambda _: "All done.", "smollm2", SMOLLM2_CONTEXT)
    with pytest.raises(EpisodeConfigError) as raised:
        gym.make("HarnessSWE-v0", harness=cli, engine=engine, sandbox="local", progress=False)
    message = str(raised.value)
    assert f"at least {load_harness(cli).min_context} tokens" in message
    assert f"the model has {SMOLLM2_CONTEXT}" in message


def test_a_local_model_whose_config_is_too_small_is_refused_at_make_without_loading(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    for fits in ("pi", "mini-swe-agent", "aider"):  # each fits 8k
        gym.make("HarnessSWE-v0", harness=fits, engine=f"hf:{tmp_path}")
    with pytest.raises(EpisodeConfigError, match="opencode needs a context window of at least"):
        gym.make("HarnessSWE-v0", harness="opencode", engine=f"hf:{tmp_path}")
    with pytest.raises(EpisodeConfigError, match="hermes needs"):  # any harness of a vector env
        gym.make_vec("HarnessSWE-v0", num_envs=2, vectorization_mode="vector_entry_point",
                     harness=["pi", "hermes"], engine=f"hf:{tmp_path}")


@pytest.mark.slow
def test_a_window_known_only_once_the_engine_loads_is_checked_by_the_episode():
    """A remote engine's window is read when it loads: the episode refuses before any sandbox."""
    engine = scripted(lambda _: "All done.", "smollm2", 1 << 20)
    env = gym.make("HarnessSWE-v0", harness="opencode", engine=engine, sandbox="local",
                   progress=False)
    engine.max_context = SMOLLM2_CONTEXT  # as a remote engine's, learnt after make()
    try:
        env.reset(options={"task_id": TASK})
        started = time.monotonic()
        _, _, _, _, info = env.step(None)
        seconds = time.monotonic() - started
    finally:
        env.close()
    assert info["outcome"] == "infra_error" and info["reward_breakdown"]["drop"] is True
    assert "at least 16384 tokens" in info["error"] and info["n_llm_calls"] == 0
    assert seconds < 30, seconds  # decided before a sandbox or the CLI starts (a CLI run: minutes)


class UncheckedOpenCode(OpenCodeHarness):
    """OpenCode with no declared minimum: only the proxy can tell it does not fit."""

    min_context = 0


@pytest.mark.slow
def test_a_first_prompt_the_proxy_refuses_ends_the_episode_as_infra_error_within_seconds():
    """OpenCode's first request is 9,102 tiny-tokenizer tokens: against 8,192 the proxy refuses
    it, and the episode stops the CLI then and there (it would compact until the timeout)."""
    engine = scripted(lambda _: "All done.", "tiny", SMOLLM2_CONTEXT)
    reward, info, seconds = step_once(UncheckedOpenCode(), engine, episode_timeout_s=600)
    assert info["outcome"] == "infra_error" and info["reward_breakdown"]["drop"] is True
    assert "first request is" in info["error"] and f"context of {SMOLLM2_CONTEXT}" in info["error"]
    # Refused, OpenCode compacts: its short summary request may be answered before the episode
    # stops the CLI (a poll interval), and changes nothing.
    assert info["n_llm_calls"] <= 2
    assert seconds < 120, seconds  # the CLI's start-up, then at most a poll interval


class UncheckedHermes(HermesHarness):
    """Hermes with no declared minimum: it starts, and refuses by itself."""

    min_context = 0


@pytest.mark.slow
def test_what_hermes_says_on_stderr_is_kept_in_harness_output():
    """Hermes exits 1 and gives its reason on stderr only; the episode keeps it."""
    engine = scripted(lambda _: "All done.", "tiny", SMOLLM2_CONTEXT)
    reward, info, seconds = step_once(UncheckedHermes(), engine)
    said = info["harness_output"]
    assert said["error"].startswith("hermes -z: agent failed:")
    assert "below the minimum 64,000" in said["error"] and said["error"] in said["stderr_tail"]
    assert info["outcome"] == "harness_error" and said["error"] in info["error"]
    assert info["n_llm_calls"] == 0


# Pi fits SmolLM2's own window; OpenCode and Claude Code run at their declared minimum, which is
# where a wrong limit (a reserve larger than the room left) would show first.
WINDOWS = {"pi": SMOLLM2_CONTEXT, "opencode": None, "claude-code": None, "gemini-cli": None,
           "codex": None, "qwen-code": None, "mini-swe-agent": None}
# Codex has no output-cap setting and sends no `max_output_tokens`: the proxy's cap is its only one.
NO_OUTPUT_CAP = ("codex",)


def told_the_limits(cli: str, turns: int) -> tuple[int, HarnessRun]:
    """(window, run) of `cli` told a window of WINDOWS[cli] (or its minimum), asked for
    `turns` commands."""
    harness = load_harness(cli)
    window = WINDOWS[cli] or harness.min_context
    engine = scripted(tool_turns(harness.shell_tool, turns), "smollm2", window)
    return window, run_harness(harness, engine, "Run three commands, one at a time.")


@pytest.fixture(scope="module")
def limit_runs(request: pytest.FixtureRequest) -> dict[str, tuple[int, HarnessRun] | Exception]:
    """cli -> told_the_limits(cli, 3), for the CLIs whose test below is selected, three at a
    time (`support.parallel`: each run its own engine, proxy and sandbox)."""
    test = test_told_the_models_limits_a_cli_neither_compacts_nor_continues
    clis = selected_params(request, test, "cli")
    return dict(zip(clis, each_in_threads(lambda cli: told_the_limits(cli, 3), clis, 3)))


@pytest.mark.slow
@pytest.mark.parametrize("cli", list(WINDOWS))
def test_told_the_models_limits_a_cli_neither_compacts_nor_continues(cli: str, limit_runs):
    turns, (window, run) = 3, result_of(limit_runs[cli])
    segments = run.trace.to_dicts()
    assert [s["role"] for s in segments] == ["agent"], run.result.stdout[-3000:]
    assert run.trace.n_llm_calls == turns + 1 == segments[0]["n_calls"]
    submits = cli == "mini-swe-agent"  # it ends on its submit command, a tool call
    assert run.trace.n_tool_calls == turns + submits
    # Each call asked for exactly the cap the CLI was told (the proxy's own cap is larger), or
    # less where the window had less room left: never more, so no answer is cut short of what
    # the CLI expects.
    cap = run.endpoint.max_tokens
    assert cap == min(ProxySettings().default_max_tokens, window // 4)
    if cli in NO_OUTPUT_CAP:
        cap = ProxySettings().default_max_tokens
    asked = segments[0]["sampling_max_tokens"]
    room = [window - call.prompt_tokens for call in run.trace.calls]
    assert asked == [min(cap, r) for r in room]


@pytest.mark.slow
def test_pi_with_the_real_smollm2_runs_short_episodes_without_compacting():
    """SmolLM2 itself (slow here: ~10 tokens/s), answers capped at 96 tokens by the session.
    Two episodes at once through one vector env: one model load, their streams batched."""
    envs = gym.make_vec("HarnessSWE-v0", num_envs=2, vectorization_mode="vector_entry_point",
                        harness="pi", engine="smollm2", sandbox="local", progress=False,
                        sampling={"max_tokens": 96}, episode_timeout_s=900)
    try:
        envs.reset(options={"task_ids": [TASK, TASK]})
        _, _, _, _, infos = envs.step(None)
    finally:
        envs.close()
    for outcome, error, trace, n_llm_calls in zip(infos["outcome"], infos["error"],
                                                   infos["trace"], infos["n_llm_calls"]):
        roles = [s["role"] for s in trace]
        assert outcome in ("passed", "failed", "harness_error"), error
        assert roles == ["agent"], roles  # no compaction call, no second segment
        assert n_llm_calls == trace[0]["n_calls"] >= 1
        assert set(trace[0]["sampling_max_tokens"]) <= set(range(1, 97))


@pytest.mark.slow
def test_aider_at_its_minimum_window_sends_one_request_asking_for_the_cap_it_was_told():
    """aider has no tools: an episode is one request (`harnesses/aider.py`), its `max_tokens`
    the cap given in its model settings, its window less that cap given as `max_input_tokens`."""
    harness = load_harness("aider")
    window = harness.min_context
    engine = scripted(lambda _: "Nothing to change.", "smollm2", window)
    run = run_harness(harness, engine, "Say whether the repository needs a change.")
    segments = run.trace.to_dicts()
    assert [s["role"] for s in segments] == ["agent"], run.result.stdout[-3000:]
    assert run.trace.n_llm_calls == 1 and run.trace.n_tool_calls == 0
    cap = run.endpoint.max_tokens
    assert cap == min(ProxySettings().default_max_tokens, window // 4)
    (call,) = run.trace.calls
    assert segments[0]["sampling_max_tokens"] == [min(cap, window - call.prompt_tokens)]


class UncheckedAider(AiderHarness):
    """aider with no declared minimum: over its `max_input_tokens` it warns, `--yes-always`
    says to proceed, and the proxy refuses the request."""

    min_context = 0


@pytest.mark.slow
def test_aider_past_its_window_proceeds_and_the_refused_prompt_is_an_infra_error():
    engine = scripted(lambda _: "Nothing to change.", "tiny", 1_024)
    reward, info, seconds = step_once(UncheckedAider(), engine, episode_timeout_s=300)
    assert info["outcome"] == "infra_error" and info["reward_breakdown"]["drop"] is True
    assert "first request is" in info["error"] and "context of 1024" in info["error"]
    assert info["n_llm_calls"] == 0
