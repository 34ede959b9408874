"""`harness-gym harnesses --check`: the installed version of each CLI, run against the real proxy
with a scripted policy, checked for what the environment relies on, so a CLI update that
breaks interception fails loudly before any rollout.

Per CLI, one headless run (a local sandbox, the tiny model's tokenizer, no weights):

- the task text reaches the model byte for byte (a probe with leading dashes, quotes, `$()`,
  backticks, CRLF, non-ASCII and an `@path`);
- the CLI's shell tool is in its tool list and one call to it round-trips: the CLI runs it,
  sends back our turn, and the bridge extends the same agent segment;
- no call asks for more output than the CLI was told (`Endpoint.max_tokens`).

A CLI with no tools (aider: `shell_tool = ""`, it edits through text blocks) is checked for the
task text and the limits only.

That nothing leaves the machine is checked where it can be: the episode tests run every CLI in
a network namespace with only loopback (tests/test_harness_episodes.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from .engines.agent_tools import AgentTools, tool_call_text
from .engines.oracle import SUBMIT_COMMAND
from .engines.scripted import ScriptedEngine
from .harness import Endpoint, HarnessSpec
from .proxy import InterceptionProxy
from .sandbox import SandboxSpec
from .sandbox.base import ExecResult
from .sandbox.local import LocalSandboxBackend
from .trace import SessionTrace

PROBE_TASK = ('--check -> "quoted" \'single\' $(whoami) `id` ${HOME} café 中文 🚀\r\n'
              "@notes.txt is text, not a file\n  trailing spaces   \nExpected: -1 fails.")
PROBE_COMMAND = "echo harness-gym-check"


@dataclass
class HarnessRun:
    result: ExecResult
    trace: SessionTrace
    endpoint: Endpoint

    def prompts(self, engine: ScriptedEngine) -> list[str]:
        """Each segment's first prompt as the model saw it (decoded token ids)."""
        return [engine.tokenizer.decode(s.prompt_ids, skip_special_tokens=False)
                for s in self.trace.segments]


def run_harness(
    harness: HarnessSpec,
    engine: ScriptedEngine,
    prompt: str,
    *,
    sampling: dict[str, Any] | None = None,
    timeout_s: float = 300,
    train_subagents: bool = False,
) -> HarnessRun:
    """One headless run of `harness` on `prompt`, through a proxy in front of `engine`, with the
    endpoint an episode would give it (the engine's window, the session's output cap)."""
    with InterceptionProxy(engine) as proxy, LocalSandboxBackend().create(SandboxSpec()) as box:
        session = proxy.open_session(sampling=sampling, train_subagents=train_subagents)
        cap = (sampling or {}).get("max_tokens") or proxy.app.settings.default_max_tokens
        endpoint = Endpoint.for_model(box.proxy_url(proxy.url), session.session_id,
                                      engine.model_name, engine.max_context, cap)
        result = harness.launch(box, endpoint, prompt).wait(timeout=timeout_s)
        proxy.close_session(session.session_id)
        return HarnessRun(result, session.trace.snapshot(), endpoint)


def scripted_engine(script: Any, tokenizer: Any, max_context: int = 131_072) -> ScriptedEngine:
    """A scripted policy in `tokenizer`, reporting `max_context` as its window (no scoring
    model: its logprobs are 0.0)."""
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    return ScriptedEngine(None, script, tokenizer=tokenizer, max_context=max_context,
                          stop_token_ids=[s for s in dict.fromkeys(stops) if s is not None],
                          model_name="policy")


def _probe_script(prompt: str) -> str:
    """One call to the CLI's shell tool, then done (the CLI's own way, where it has one)."""
    tools = AgentTools.from_prompt(prompt)
    if tools.shell is None:
        return "No shell tool."
    if "<tool_response>" not in prompt:
        return f"Checking.\n{tool_call_text(tools.shell_call(PROBE_COMMAND))}"
    if SUBMIT_COMMAND in prompt:
        return f"Done.\n{tool_call_text(tools.shell_call(SUBMIT_COMMAND))}"
    return "Done."


def check_harness(harness: HarnessSpec, timeout_s: float = 300) -> list[str]:
    """What the installed CLI gets wrong of what the environment relies on ([]: nothing)."""
    from .engines.tiny import load_tiny_tokenizer

    engine = scripted_engine(_probe_script, load_tiny_tokenizer())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the local sandbox's "unisolated" warning
        run = run_harness(harness, engine, PROBE_TASK, timeout_s=timeout_s)
    problems = []
    prompts = run.prompts(engine)
    if not prompts:
        return [f"it made no model call (exit {run.result.exit_code}): "
                f"{(run.result.stderr or run.result.stdout)[-300:]!r}"]
    if PROBE_TASK not in prompts[0]:
        problems.append("the task text did not reach the model byte for byte")
    if harness.shell_tool and f"<tool_call>\n{{\"name\": \"{harness.shell_tool}\"" not in (
            engine.tokenizer.decode(run.trace.segments[0].response_ids)):
        problems.append(f"its shell tool {harness.shell_tool!r} is not in its tool list")
    agents = [s for s in run.trace.segments if s.role == "agent"]
    if harness.shell_tool and (
            run.trace.n_tool_calls < 1 or len(agents) != 1 or agents[0].n_calls < 2):
        problems.append(
            f"the tool call did not round-trip as one segment: {run.trace.n_tool_calls} tool "
            f"calls, {len(agents)} agent segments of {[s.n_calls for s in agents]} calls")
    asked = [c.max_tokens for s in agents for c in s.sampling if c is not None]
    if any(m > run.endpoint.max_tokens for m in asked):
        problems.append(f"it asked for {max(asked)} output tokens, told {run.endpoint.max_tokens}")
    return problems
