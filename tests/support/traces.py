"""Trace files for the trace viewer's tests, written as `harness-gym run` writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai

from harness_gym.engines import load_engine
from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy

from .engines import tool_call_script

TOOL_OUTPUT = "TOOL-OUTPUT-42 written"
BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def tool_call_segments() -> list[dict[str, Any]]:
    """A real trace: through the proxy with the openai SDK, a tiny-scored scripted policy calls
    bash, the client answers with TOOL_OUTPUT, the policy says it is done (one segment)."""
    tiny = load_engine("tiny")
    try:
        with InterceptionProxy(ScriptedEngine(tiny, tool_call_script(turns=2))) as proxy:
            session = proxy.open_session()
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)
            messages: list[dict[str, Any]] = [{"role": "user", "content": "make out0.txt"}]
            first = client.chat.completions.create(model="policy", messages=messages,
                                                   tools=[BASH]).choices[0].message
            call = first.tool_calls[0]
            messages += [
                {"role": "assistant", "content": first.content, "tool_calls": [
                    {"id": call.id, "type": "function", "function": {
                        "name": call.function.name, "arguments": call.function.arguments}}]},
                {"role": "tool", "tool_call_id": call.id, "content": TOOL_OUTPUT},
            ]
            client.chat.completions.create(model="policy", messages=messages, tools=[BASH])
            return session.trace_json()["segments"]
    finally:
        tiny.close()


def episode_record(segments: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """One line of a runs JSONL, as `harness-gym run` writes it."""
    record = {"episode": 0, "task_id": "demo-task", "harness": "pi", "outcome": "passed",
              "reward": 0.99, "n_llm_calls": 2, "n_tool_calls": 1, "model": "tiny",
              "tokenizer": "tiny", "trace": segments}
    record.update(fields)
    return record


def write_run(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
