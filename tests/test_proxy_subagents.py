"""Sub-agents get their own segments, linked to the tool call that started them.

Driven at the proxy level through the official `anthropic` SDK, in the shape Claude Code's
Task/Agent tool gives its traffic (measured from its requests): the parent calls `Task` with a
brief; the sub-agent's conversation comes through the same session key with its own system
prompt, its own tool set and the brief as its first user message (after a system reminder);
its answer returns to the parent as the Task call's tool result. A title-generation call with no
tools stays unlinked. The policy is a `ScriptedEngine` over `tiny`.
"""

from __future__ import annotations

import json

import anthropic
import pyarrow as pa
from rich.console import Console

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy
from harness_gym.trace import normalize_segment
from harness_gym.runs.trace_view import Episode, Tokenizers, print_terminal, segment_tree

BRIEF = "Find the function that computes slugs and report its file and line."


def tool(name: str) -> dict:
    return {"name": name, "description": f"The {name} tool.",
            "input_schema": {"type": "object", "properties": {
                "command": {"type": "string"}, "prompt": {"type": "string"},
                "description": {"type": "string"}}}}


PARENT_TOOLS = [tool("Bash"), tool("Read"), tool("Task")]
SUBAGENT_TOOLS = [tool("Bash"), tool("Read")]


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def policy(prompt: str) -> str:
    if "You are a search sub-agent." in prompt:
        if "<tool_response>" in prompt:
            return "It is slugify in slugs.py, line 3."
        return call("Bash", command="grep -n 'def slug' -r .")
    if "<tools>" not in prompt:
        return "Fix the slug bug"  # title generation
    if "<tool_response>" in prompt:
        return "All done."
    return "Delegating the search.\n" + call("Task", description="find slugs", prompt=BRIEF)


def run_claude_code_like_episode(proxy: InterceptionProxy, **session_options) -> tuple:
    session = proxy.open_session(**session_options)
    client = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id, max_retries=0)

    def ask(system, tools, messages):
        kw = {"model": "policy", "max_tokens": 256, "system": system, "messages": messages}
        if tools:
            kw["tools"] = tools
        with client.messages.stream(**kw) as stream:  # Claude Code always streams
            return stream.get_final_message()

    parent = [{"role": "user", "content": "Fix the slug bug."}]
    first = ask("You are Claude Code.", PARENT_TOOLS, parent)
    [task] = [b for b in first.content if b.type == "tool_use"]
    ask("Write a 3-word title.", None, [{"role": "user", "content": "Fix the slug bug."}])

    sub = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>Today is Monday.</system-reminder>"},
        {"type": "text", "text": task.input["prompt"]}]}]
    sub_first = ask("You are a search sub-agent.", SUBAGENT_TOOLS, sub)
    [grep] = [b for b in sub_first.content if b.type == "tool_use"]
    sub += [{"role": "assistant", "content": [b.model_dump() for b in sub_first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": grep.id,
                                          "content": "slugs.py:3:def slugify(text):"}]}]
    report = ask("You are a search sub-agent.", SUBAGENT_TOOLS, sub)

    parent += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": task.id,
                                             "content": report.content[0].text}]}]
    final = ask("You are Claude Code.", PARENT_TOOLS, parent)
    assert final.content[0].text == "All done."
    return session.trace_json()["segments"], task.id


def test_a_subagent_is_its_own_segment_linked_to_the_task_call(tiny):
    with InterceptionProxy(ScriptedEngine(tiny, policy)) as proxy:
        segments, task_id = run_claude_code_like_episode(proxy)
    parent, title, subagent = segments
    assert parent["role"] == "agent" and parent["n_calls"] == 2 and parent["parent"] is None
    assert title["role"] == "auxiliary" and title["parent"] is None
    assert title["parent_call_id"] is None
    assert subagent["role"] == "auxiliary" and subagent["n_calls"] == 2  # one bridged segment
    assert subagent["parent"] == 0
    # The call id as the proxy issued it; the Anthropic client saw the same suffix as toolu_.
    assert subagent["parent_call_id"].startswith("call_")
    assert task_id == "toolu_" + subagent["parent_call_id"].removeprefix("call_")


def test_subagents_are_trainable_by_option(tiny):
    with InterceptionProxy(ScriptedEngine(tiny, policy)) as proxy:
        segments, _ = run_claude_code_like_episode(proxy, train_subagents=True)
    assert [s["role"] for s in segments] == ["agent", "auxiliary", "agent"]
    assert segments[2]["parent"] == 0 and segments[2]["parent_call_id"]


def test_the_link_survives_parquet_and_harness_gym_trace_shows_the_tree(tiny):
    from harness_gym.wrappers.record_traces import SEGMENT

    with InterceptionProxy(ScriptedEngine(tiny, policy)) as proxy:
        segments, _ = run_claude_code_like_episode(proxy)
    stored = pa.array(segments, type=SEGMENT).to_pylist()
    assert [normalize_segment(s) for s in stored] == [normalize_segment(s) for s in segments]
    assert segment_tree(stored) == [(0, 0), (2, 1), (1, 0)]

    console = Console(record=True, width=400, color_system=None)
    episode = Episode(0, None, {"trace": stored, "tokenizer": "tiny"})
    print_terminal([episode], Tokenizers(), console=console)
    headers = [line for line in console.export_text().splitlines() if "segment " in line]
    assert headers[0].startswith("segment 0: role=agent")
    assert headers[1].startswith("  └ segment 2: role=auxiliary")
    assert f"sub-agent of segment 0 (tool call {segments[2]['parent_call_id']})" in headers[1]
    assert headers[2].startswith("segment 1: role=auxiliary")


def test_a_tool_call_whose_argument_merely_repeats_the_task_does_not_adopt_the_agent(tiny):
    """A compaction of the agent itself (same tool set) is never taken for a sub-agent, even
    when its opening text holds a tool argument."""

    def echoing(prompt: str) -> str:
        if "<tool_response>" in prompt or "Summary" in prompt:
            return "ok"
        return call("Bash", command="echo a long enough command to count as a brief")

    with InterceptionProxy(ScriptedEngine(tiny, echoing)) as proxy:
        session = proxy.open_session()
        client = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id,
                                     max_retries=0)
        kw = {"model": "policy", "max_tokens": 64, "tools": PARENT_TOOLS}
        client.messages.create(messages=[{"role": "user", "content": "Go."}], **kw)
        client.messages.create(messages=[{"role": "user", "content": (
            "Summary: ran echo a long enough command to count as a brief")}], **kw)
        segments = session.trace_json()["segments"]
    assert [(s["role"], s["parent"], s["parent_call_id"]) for s in segments] == [
        ("agent", None, None), ("agent", None, None)]
