"""What happens when a conversation outgrows the model's context (DESIGN invariant 4; the
env's `context_overflow` policy)."""

from __future__ import annotations

import openai
import pytest

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy
from harness_gym.proxy.bridge import TRUNCATED_TOOL_RESULT
from support.engines import RecordingEngine, tool_call_script

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command.",
                                         "parameters": {"type": "object", "properties": {}}}}


def converse(proxy, session, turns: int, result_chars: int) -> list[dict]:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
    messages = [{"role": "user", "content": "Fix the bug."}]
    for turn in range(turns):
        message = client.chat.completions.create(model="m", messages=messages, tools=[BASH])
        message = message.choices[0].message
        call = message.tool_calls[0]
        messages.append({"role": "assistant", "content": message.content, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]})
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": f"result {turn} " + "lorem ipsum " * (result_chars // 12)})
    return messages


def test_by_default_an_overflowing_prompt_gets_the_context_length_error(tiny):
    engine = ScriptedEngine(tiny, tool_call_script(turns=99))
    engine.max_context = 1500
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 64})
        with pytest.raises(openai.BadRequestError, match="maximum context length is 1500"):
            converse(proxy, session, turns=12, result_chars=600)
        assert all(s["role"] == "agent" for s in session.trace_json()["segments"])


def test_truncate_blanks_the_oldest_tool_results_and_starts_a_new_segment(tiny):
    engine = RecordingEngine(ScriptedEngine(tiny, tool_call_script(turns=99)))
    engine.max_context = 1500
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 64}, context_overflow="truncate")
        converse(proxy, session, turns=12, result_chars=600)
        trace = session.trace_json()
    calls = session.trace.calls
    assert trace["n_truncations"] >= 1 and trace["n_llm_calls"] == 12
    assert all(len(c["prompt_ids"]) + 64 <= 1500 for c in engine.calls)  # every prompt fit
    segments = trace["segments"]
    assert len(segments) >= 2 and all(s["role"] == "agent" for s in segments)
    # Truncated calls start segments; the calls after one extend it (no fork per call).
    starts = [c for c in calls if c.kind == "new"]
    assert [c.truncated_tool_results > 0 for c in starts] == [False] + [True] * (len(starts) - 1)
    after = calls[calls.index(starts[1]) + 1 :]
    assert any(c.kind == "extend" for c in after)  # a truncated segment is extended, not re-cut
    first_truncated = segments[1]
    text = tiny.tokenizer.decode(first_truncated["prompt_ids"])
    assert TRUNCATED_TOOL_RESULT in text and "result 0 lorem" not in text
    # Token faithfulness holds across the truncation: mask-1 spans are the engine's tokens.
    sampled = [t for s in segments for t, m in zip(s["response_ids"], s["loss_mask"]) if m]
    assert sampled == [t for c in engine.calls for t in c["token_ids"]]


def test_an_unknown_overflow_policy_is_refused(tiny):
    with InterceptionProxy(tiny) as proxy:
        with pytest.raises(Exception, match="context_overflow"):
            proxy.open_session(context_overflow="shrink")


def test_a_refused_first_prompt_stays_the_sign_a_cli_cannot_start_after_a_shorter_call_fits(tiny):
    """OpenCode refused at once compacts: a shorter request fits and is answered, then the long
    prompt comes back. The first refusal still says the CLI cannot work in this context (else
    whether the episode stops depends on which the watcher saw first); a refusal after an
    answered call is an ordinary overflow."""
    engine = ScriptedEngine(tiny, tool_call_script(turns=99))
    engine.max_context = 1500
    long = [{"role": "user", "content": "Fix the bug. " + "lorem ipsum " * 600}]
    short = [{"role": "user", "content": "Summarize the conversation."}]
    with InterceptionProxy(engine) as proxy:
        refused_first = proxy.open_session(sampling={"max_tokens": 16})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=refused_first.session_id,
                               max_retries=0)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 1500"):
            client.chat.completions.create(model="m", messages=long, tools=[BASH])
        client.chat.completions.create(model="m", messages=short, tools=[BASH])
        assert refused_first.trace.n_llm_calls == 1
        overflow = refused_first.trace.first_prompt_overflowed
        assert overflow is not None and overflow.after_calls == 0
        assert overflow.max_context == 1500 and overflow.prompt_tokens > 1500

        answered_first = proxy.open_session(sampling={"max_tokens": 16})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=answered_first.session_id,
                               max_retries=0)
        client.chat.completions.create(model="m", messages=short, tools=[BASH])
        with pytest.raises(openai.BadRequestError, match="maximum context length is 1500"):
            client.chat.completions.create(model="m", messages=long, tools=[BASH])
        assert answered_first.trace.first_prompt_overflowed is None
        assert [o.after_calls for o in answered_first.trace.overflows] == [1]
