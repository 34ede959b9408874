"""The real CLIs, through the real proxy, with a scripted policy: what the model is shown
and what the bridge makes of what the CLIs send back.

- The task text reaches the model byte for byte (decoded from the prompt ids the engine got),
  whatever it holds: leading dashes, `->`, quotes, backslashes, `$()`, backticks, non-ASCII, an
  "@file", a line starting with "/", Jinja `{{ }}` and `{% %}`, CRLF, 20 KB.
- A tool call with `120000.0`, `1e5` and a 20-digit integer in its arguments, echoed back by a
  JavaScript CLI as `120000`, `100000` and `12345678901234567000`, stays one agent segment.

The policy is a `ScriptedEngine` in the tiny model's tokenizer without a scoring model: these
tests look at token ids and segments, not at logprobs.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
from support.fidelity import HarnessRun, run_harness, scripted
from support.parallel import each_in_threads, in_threads, result_of, selected_params

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.episode import TASK_INSTRUCTION
from harness_gym.harness import load_harness

pytestmark = [
    pytest.mark.skipif(shutil.which("npm") is None, reason="the CLIs install with npm"),
    pytest.mark.timeout(900),
]

CLIS = ("aider", "claude-code", "codex", "gemini-cli", "hermes", "mini-swe-agent", "opencode",
        "pi", "qwen-code")
JAVASCRIPT_CLIS = ("claude-code", "gemini-cli", "opencode", "pi", "qwen-code")

_HEAD = (
    "--width -> must stay positive\n"
    "-h prints help, and so does --help=\"full\"\n"
    "@notes.txt is text, not a file to attach\n"
    "/usr/bin/env is a path, not a command\n"
)
_LINES = [
    'parse("a -> b") returns "a\\\\b" instead of \'a -> b\'\n',
    "the shell sees $(whoami) and `id` and ${HOME} and $PATH literally\n",
    "  - a bullet with -- dashes and trailing spaces   \n",
    "Windows line\r\n",
    "tabs\tbetween\tcells; a backslash at the end \\\n",
    "café, naïve, 中文, Ελληνικά, emoji 🚀 (NFC text)\n",
    '{"json": [1, 2.50, -3e4], "quote": "\\"x\\""} %s %d {{ jinja }} {% if x %}{% endif %}\n',
]


def problem_statement(size: int = 20_000) -> str:
    lines, n = [_HEAD], 0
    while sum(len(line.encode()) for line in lines) < size:
        lines.append(f"{n:04d} {_LINES[n % len(_LINES)]}")
        n += 1
    return "".join(lines) + "Expected: -1 is rejected with an error."


def _installed(name: str):
    harness = load_harness(name)
    if not harness.is_installed():
        harness.install()
    return harness


def task_text_run(cli: str) -> tuple[str, ScriptedEngine, HarnessRun]:
    """(prompt, engine, run): `cli` given the 20 KB task text, the policy answering "Done."."""
    statement = problem_statement()
    assert len(statement.encode()) > 20_000
    prompt = statement + TASK_INSTRUCTION
    engine = scripted(lambda _: "Done.")
    return prompt, engine, run_harness(_installed(cli), engine, prompt)


def numbers_run(cli: str) -> HarnessRun:
    """`cli` asked to run a tool call whose arguments hold NUMBERS, then "Done."."""
    harness = _installed(cli)

    def script(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "Done."
        return ('<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
                % (harness.shell_tool, NUMBERS))

    return run_harness(harness, scripted(script), "Run the command.")


@pytest.fixture(scope="module")
def cli_runs(request: pytest.FixtureRequest) -> dict[tuple[str, str], Any]:
    """(test, cli) -> its run (or the error it raised) for the two per-CLI tests below, those
    selected, three CLI runs at a time (`support.parallel`: each run its own engine, proxy
    and sandbox) instead of one after the other."""
    tests = {task_text_run: test_the_model_sees_the_task_text_byte_for_byte,
             numbers_run: test_numbers_a_javascript_cli_reserializes_keep_one_agent_segment}
    wanted = [(run, cli) for run, test in tests.items()
              for cli in selected_params(request, test, "cli")]
    done = each_in_threads(lambda job: job[0](job[1]), wanted, 3)
    return {(run.__name__, cli): outcome for (run, cli), outcome in zip(wanted, done)}


@pytest.mark.slow
@pytest.mark.parametrize("cli", CLIS)
def test_the_model_sees_the_task_text_byte_for_byte(cli: str, cli_runs) -> None:
    prompt, engine, run = result_of(cli_runs[("task_text_run", cli)])
    assert run.trace.n_llm_calls >= 1, run.result.stderr[-2000:]
    agent_prompt = run.prompts(engine)[0]
    # The whole user text, bounded: after the turn header (or a system-reminder block the CLI
    # sends before it: Claude Code's, or Qwen Code's, a content part of its own) and up to the
    # end of the turn; nothing added before or after it.
    assert any(f"{before}{prompt}<|im_end|>" in agent_prompt
               for before in ("\n", "</system-reminder>")), _first_difference(prompt, agent_prompt)


def _first_difference(expected: str, shown: str) -> str:
    anchor = expected[:40]
    at = shown.find(anchor)
    if at < 0:
        return f"the prompt's start {anchor!r} is not in what the model saw"
    for i, (a, b) in enumerate(zip(expected, shown[at:])):
        if a != b:
            return f"differs at {i}: expected {expected[i:i + 40]!r}, saw {shown[at + i:at + i + 40]!r}"
    return "the prompt is cut short"


NUMBERS = '{"command": "echo ok", "timeout": 120000.0, "n": 1e5, "big": 12345678901234567890}'


@pytest.mark.slow
@pytest.mark.parametrize("cli", JAVASCRIPT_CLIS)
def test_numbers_a_javascript_cli_reserializes_keep_one_agent_segment(cli: str,
                                                                     cli_runs) -> None:
    run = result_of(cli_runs[("numbers_run", cli)])
    segments = run.trace.to_dicts()
    agents = [s for s in segments if s["role"] == "agent"]
    assert run.trace.n_llm_calls == 2, run.result.stdout[-3000:]
    assert [s["n_calls"] for s in agents] == [2], [s["role"] for s in segments]
    # The second call extended the first: its prompt holds the tool call as sampled.
    calls = run.trace.calls
    assert (calls[1].kind, calls[1].bridged) == ("extend", True)
    assert json.loads(NUMBERS)["big"] == 12345678901234567890  # spelled as the model wrote it


@pytest.mark.slow
def test_opencode_and_the_oracle_pass_the_builtin_tasks_an_argument_parser_could_misread():
    """Five built-in tasks hold a piece starting with "-"; passed as an argument, OpenCode showed
    the model a quoted, escaped text and the oracle failed slugs-40. Every built-in task whose
    statement holds a piece a CLI's argument parser treats apart ("-" a flag, "@" a file, "/" a
    command) runs here; the other six have nothing of that kind, and the oracle's solving them
    through OpenCode is `test_harness_episodes`' part. Three envs at once, each with its share
    of the tasks (`support.parallel`)."""
    import gymnasium as gym

    import harness_gym  # noqa: F401
    from harness_gym.tasks.loader import load_tasks

    _installed("opencode")
    tasks = [t for t in load_tasks("builtin")
             if any(piece[0] in "-@/" for piece in t.problem_statement.split())]
    assert len(tasks) == 7

    def solve(share):
        seen = []
        for env, task in share:
            env.reset(options={"task_id": task.instance_id})
            _, _, _, _, info = env.step(None)
            seen.append((info["outcome"], info["error"], [s["role"] for s in info["trace"]]))
        return seen

    # Each env's engine loads and its proxy starts (the first reset) here, one after another;
    # only the episodes run side by side.
    envs = []
    try:
        for _ in range(3):
            envs.append(gym.make("HarnessSWE-v0", harness="opencode", engine="oracle",
                                 sandbox="local", progress=False, episode_timeout_s=300))
            envs[-1].reset(options={"task_id": tasks[0].instance_id})
        runs = in_threads(solve, [(envs[i % 3], t) for i, t in enumerate(tasks)], workers=3)
    finally:
        for env in envs:
            env.close()
    outcomes = dict(zip([t.instance_id for t in tasks], runs))
    for task_id, (_, _, roles) in outcomes.items():
        assert roles.count("agent") == 1, (task_id, roles)
    passed = {t.instance_id: "passed" for t in tasks}
    assert {t: outcome for t, (outcome, _, _) in outcomes.items()} == passed, outcomes
