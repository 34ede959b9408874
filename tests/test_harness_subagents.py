"""Real Claude Code runs a sub-agent through its Agent (Task) tool; the proxy links it.

A scripted policy (tiny's tokenizer, no scoring model: segments are what is checked) makes the
parent call the Agent tool with a brief; Claude Code then runs the sub-agent's conversation
through the same session (its own system prompt and tool set, the brief as its first user
message), the sub-agent reports, and the parent finishes. The sub-agent's segment must hang
under the parent's segment and name the Agent call; with `train_subagents` it is trained on.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from support.fidelity import run_harness, scripted

from harness_gym.harness import load_harness

pytestmark = [
    pytest.mark.skipif(shutil.which("npm") is None, reason="the CLIs install with npm"),
    pytest.mark.timeout(900),
]

BRIEF = "Find the function that computes slugs and report its file and line."
TOOL_NAMES = re.compile(r'"name": "([A-Za-z_]+)", "description"')


def policy(prompt: str) -> str:
    if "<tool_response>" in prompt:
        return "All done."
    if BRIEF in prompt:  # the sub-agent: its first user message is the brief
        return "It is slugify in slugs.py, line 3."
    if "<tools>" not in prompt:
        return "Slug search"  # a side call (title)
    tools = TOOL_NAMES.findall(prompt)
    name = "Agent" if "Agent" in tools else "Task"  # renamed across Claude Code versions
    arguments = {"description": "find slugs", "prompt": BRIEF,
                 "subagent_type": "general-purpose", "run_in_background": False}
    return ("Delegating the search.\n<tool_call>\n"
            + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>")


@pytest.mark.slow
def test_claude_codes_subagent_is_a_trainable_segment_linked_to_the_agent_call() -> None:
    harness = load_harness("claude-code")
    if not harness.is_installed():
        harness.install()
    run = run_harness(harness, scripted(policy), "Find the slug function.",
                      train_subagents=True)
    assert "All done." in run.result.stdout, run.result.stdout[-3000:]
    segments = run.trace.to_dicts()
    roots = [i for i, s in enumerate(segments) if s["role"] == "agent" and s["parent"] is None]
    assert len(roots) == 1, [(s["role"], s["parent"]) for s in segments]
    parent = roots[0]
    assert segments[parent]["n_calls"] == 2  # the Agent call, then the answer after its result
    subagents = [s for s in segments if s["parent_call_id"]]
    assert len(subagents) == 1, [(s["role"], s["parent"], s["parent_call_id"]) for s in segments]
    [subagent] = subagents
    assert subagent["parent"] == parent and subagent["role"] == "agent"
    # The id is the Agent call's: Claude Code echoed it (as toolu_...) with the sub-agent's report.
    suffix = subagent["parent_call_id"].removeprefix("call_")
    transcript = run.result.stdout
    assert f"toolu_{suffix}" in transcript
