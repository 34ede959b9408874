"""A policy that thinks: reasoning goes out in each dialect's own form, streams as it is sampled,
and comes back through the official SDKs to the exact sampled ids; altered echoes are caught.

The policy is the tiny model under a Qwen3-style template (tests/support/thinking.py), which
drops earlier reasoning from the rendered history. A `ScriptedEngine` over it writes the
`<think>` blocks and tool calls a random model never would; its logprobs are tiny's real scores.
"""

from __future__ import annotations

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.engines import RecordingEngine, tool_call_script
from support.thinking import thinking, thinking_tokenizer
from test_proxy_openai_chat import assert_segment_is_what_the_engine_sampled

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.engines.transformers_engine import TransformersEngine
from harness_gym.proxy import InterceptionProxy
from harness_gym.proxy.events import ReasoningDelta, ReasoningDone
from harness_gym.proxy.reasoning import ReasoningFormat, ReasoningSigner, ThinkSplitter

TURNS = 3
SHELL = {"type": "object", "properties": {"command": {"type": "string"}}}


def thought(step: int) -> str:
    return f"Step {step}: the file should hold step{step}."


def thinking_policy(tiny, turns: int = TURNS) -> RecordingEngine:
    return RecordingEngine(ScriptedEngine(
        tiny, thinking(tool_call_script(turns=turns), thought), tokenizer=thinking_tokenizer()))


# --- the splitter and the signer, alone -------------------------------------------------


def split(chunks: list[str], opened: bool = False) -> tuple[list, str]:
    """The reasoning events (deltas joined into one) and the answer text."""
    splitter = ThinkSplitter(ReasoningFormat(opened=opened), lambda text: f"sig({text})")
    pieces = [p for chunk in chunks for p in splitter.feed(chunk)] + splitter.finish()
    answer = "".join(p for p in pieces if isinstance(p, str))
    shown = "".join(p.text for p in pieces if isinstance(p, ReasoningDelta))
    events = [ReasoningDelta(shown)] if shown else []
    events += [p for p in pieces if isinstance(p, ReasoningDone)]
    kinds = [isinstance(p, str) for p in pieces]
    assert kinds == sorted(kinds)  # all reasoning comes before any answer text
    return events, answer


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([
    "<think>\nplan: a < b </thin k>\n</think>\n\nHello <tool_call>x</tool_call>",
    "  <think>\n\n</think>\n\nNo thoughts.",
    "<thinking> is a tag too",
    "plain answer <think>not reasoning</think>",
    "<think>cut off mid-thought",
]), st.data())
def test_streamed_in_any_pieces_the_split_is_the_same(text, data):
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=8)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert split(chunks) == split([text])


def test_reasoning_is_what_is_between_the_tags_trimmed_and_signed():
    events, answer = split(["<think>\n I plan.\n\n</think>\n\nHello."])
    assert events == [ReasoningDelta("I plan."), ReasoningDone("I plan.", "sig(I plan.)")]
    assert answer == "Hello."
    assert split(["<thinking> is a tag too"]) == ([], "<thinking> is a tag too")
    # Cut off inside the reasoning (max_tokens): what there is, still signed.
    assert split(["<think>cut off"])[0][-1] == ReasoningDone("cut off", "sig(cut off)")
    # A prompt that opened <think> already: the answer starts inside the reasoning.
    assert split(["so.</think>done"], opened=True) == (
        [ReasoningDelta("so."), ReasoningDone("so.", "sig(so.)")], "done")


def test_a_signature_verifies_only_for_its_text_and_its_session():
    key = b"k" * 32
    ours, other = ReasoningSigner(key, "session-a"), ReasoningSigner(key, "session-b")
    signature = ours.sign("I plan.")
    assert ours.verify("I plan.", signature)
    assert not ours.verify("I plan!", signature)
    assert not other.verify("I plan.", signature)
    assert not ours.verify("I plan.", signature[:-1] + ("A" if signature[-1] != "A" else "B"))


# --- Anthropic Messages ------------------------------------------------------------------


def ask_anthropic(client, messages, stream: bool) -> tuple[anthropic.types.Message, int]:
    """One call; the message, and how many thinking deltas streamed (0 when not streaming)."""
    kw = {"model": "policy", "max_tokens": 256, "messages": messages,
          "tools": [{"name": "bash", "description": "Run a shell command.",
                     "input_schema": SHELL}]}
    if not stream:
        return client.messages.create(**kw), 0
    with client.messages.stream(**kw) as events:
        deltas = sum(1 for e in events if e.type == "content_block_delta"
                     and e.delta.type == "thinking_delta")
        return events.get_final_message(), deltas


def echo_anthropic(message, *, thinking_blocks: str = "as-is") -> dict:
    """The turn as Claude Code sends it back; `thinking_blocks`: "as-is", "drop", "resign"
    (a forged signature), "rewrite" (other text, our signature)."""
    blocks = []
    for block in message.content:
        if block.type == "thinking":
            if thinking_blocks == "drop":
                continue
            text, signature = block.thinking, block.signature
            if thinking_blocks == "resign":
                signature = "hgr1." + "A" * 43
            elif thinking_blocks == "rewrite":
                text = text + " (edited)"
            blocks.append({"type": "thinking", "thinking": text, "signature": signature})
        elif block.type == "text":
            blocks.append({"type": "text", "text": block.text})
        else:
            blocks.append({"type": "tool_use", "id": block.id, "name": block.name,
                           "input": block.input})
    return {"role": "assistant", "content": blocks}


def anthropic_conversation(proxy, echo: str, stream: bool, session_hook=None):
    session = proxy.open_session()
    client = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id, max_retries=0)
    messages = [{"role": "user", "content": "Fix the bug."}]
    answers = []
    for turn in range(TURNS):
        answer, deltas = ask_anthropic(client, messages, stream)
        answers.append((answer, deltas))
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": f"ok {turn}"}
                   for b in answer.content if b.type == "tool_use"]
        messages += [echo_anthropic(answer, thinking_blocks=echo if turn == 0 else "as-is"),
                     {"role": "user", "content": results}]
    return session, answers


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_anthropic_thinking_round_trip_keeps_one_segment_of_the_sampled_ids(tiny, stream):
    engine = thinking_policy(tiny)
    with InterceptionProxy(engine) as proxy:
        session, answers = anthropic_conversation(proxy, "as-is", stream)
        trace = session.trace_json()
    for step, (answer, deltas) in enumerate(answers):
        block = answer.content[0]
        assert block.type == "thinking" and block.thinking == thought(step)
        assert session.signer.verify(block.thinking, block.signature)
        if stream:  # streamed as it was sampled: one delta per sampled token here
            assert deltas > 5
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert trace["n_altered_reasoning"] == 0
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)
    assert [c.missing_reasoning for c in session.trace.calls] == [0, 0, 0]


@pytest.mark.parametrize("tamper", ["resign", "rewrite"])
def test_an_altered_thinking_block_is_detected_and_forks(tiny, tamper):
    engine = thinking_policy(tiny)
    with InterceptionProxy(engine) as proxy:
        session, _ = anthropic_conversation(proxy, tamper, stream=True)
        trace = session.trace_json()
    # Call 2 saw the altered turn 0: it cannot extend it. Call 3 repeats the same altered
    # history plus call 2's turn, and extends call 2's segment.
    assert [c.altered_reasoning for c in session.trace.calls] == [0, 1, 1]
    assert trace["n_altered_reasoning"] == 2
    assert [s["n_calls"] for s in trace["segments"]] == [1, 2]
    assert [c.kind for c in session.trace.calls] == ["new", "new", "extend"]


def test_a_dropped_thinking_block_still_reuses_the_sampled_ids(tiny):
    engine = thinking_policy(tiny)
    with InterceptionProxy(engine) as proxy:
        session, _ = anthropic_conversation(proxy, "drop", stream=False)
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert [c.missing_reasoning for c in session.trace.calls] == [0, 1, 1]
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)
    # The reasoning the CLI did not echo is in the next prompt all the same: its sampled ids.
    assert thought(0) in tiny.tokenizer.decode(engine.calls[1]["prompt_ids"])


def test_a_signature_from_another_session_does_not_verify(tiny):
    engine = thinking_policy(tiny)
    with InterceptionProxy(engine) as proxy:
        first, answers = anthropic_conversation(proxy, "as-is", stream=False)
        second = proxy.open_session()
        client = anthropic.Anthropic(base_url=proxy.url, api_key=second.session_id,
                                     max_retries=0)
        messages = [{"role": "user", "content": "Fix the bug."}]
        answer, _ = ask_anthropic(client, messages, False)
        (theirs,) = [b for b in answers[0][0].content if b.type == "thinking"]
        echoed = echo_anthropic(answer)
        echoed["content"][0]["signature"] = theirs.signature  # same text, other session's MAC
        ask_anthropic(client, messages + [echoed, {"role": "user", "content": "go on"}], False)
    assert second.trace.calls[-1].altered_reasoning == 1


# --- OpenAI Chat Completions -------------------------------------------------------------


def ask_chat(client, messages, stream: bool) -> tuple[dict, int]:
    """One call; the assistant message as a CLI echoes it (reasoning_content included), and how
    many chunks carried reasoning."""
    kw = {"model": "policy", "messages": messages,
          "tools": [{"type": "function", "function": {"name": "bash", "parameters": SHELL}}]}
    if not stream:
        message = client.chat.completions.create(**kw).choices[0].message
        return {"role": "assistant", "content": message.content,
                "reasoning_content": (message.model_extra or {}).get("reasoning_content"),
                "tool_calls": [c.model_dump() for c in message.tool_calls or []]}, 0
    reasoning, text, calls, chunks = [], [], [], 0
    for chunk in client.chat.completions.create(stream=True, **kw):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        if (delta.model_extra or {}).get("reasoning_content"):
            chunks += 1
            reasoning.append(delta.model_extra["reasoning_content"])
        text.append(delta.content or "")
        calls += [c.model_dump(exclude={"index"}) for c in delta.tool_calls or []]
    return {"role": "assistant", "content": "".join(text), "reasoning_content": "".join(reasoning),
            "tool_calls": calls}, chunks


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("echo", ["as-is", "drop", "rewrite"])
def test_chat_reasoning_content_round_trip(tiny, stream, echo):
    engine = thinking_policy(tiny)
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session()
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                               max_retries=0)
        messages = [{"role": "user", "content": "Fix the bug."}]
        for turn in range(TURNS):
            assistant, chunks = ask_chat(client, messages, stream)
            assert assistant["reasoning_content"] == thought(turn)
            assert chunks > 5 if stream else chunks == 0
            if turn == 0 and echo == "drop":
                del assistant["reasoning_content"]
            elif turn == 0 and echo == "rewrite":
                assistant["reasoning_content"] = "Something else."
            messages += [assistant, *({"role": "tool", "tool_call_id": c["id"],
                                       "content": f"ok {turn}"} for c in assistant["tool_calls"])]
        trace = session.trace_json()
    calls = session.trace.calls
    if echo == "rewrite":
        assert [c.altered_reasoning for c in calls] == [0, 1, 1]
        assert [s["n_calls"] for s in trace["segments"]] == [1, 2]
        return
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert [c.missing_reasoning for c in calls] == ([0, 1, 1] if echo == "drop" else [0, 0, 0])
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)


# --- OpenAI Responses --------------------------------------------------------------------


def ask_responses(client, items, stream: bool) -> list[dict]:
    kw = {"model": "policy", "input": items, "store": False,
          "tools": [{"type": "function", "name": "bash", "parameters": SHELL}]}
    if not stream:
        response = client.responses.create(**kw)
    else:
        with client.responses.stream(**kw) as events:
            deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
            response = events.get_final_response()
        assert len(deltas) > 5
    return [item.model_dump(exclude_none=True) for item in response.output]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("echo", ["as-is", "resign"])
def test_responses_reasoning_items_round_trip(tiny, stream, echo):
    engine = thinking_policy(tiny)
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session()
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                               max_retries=0)
        items: list[dict] = [{"role": "user", "content": "Fix the bug."}]
        for turn in range(TURNS):
            output = ask_responses(client, items, stream)
            reasoning = output[0]
            assert reasoning["type"] == "reasoning"
            assert reasoning["content"] == [{"type": "reasoning_text", "text": thought(turn)}]
            assert session.signer.verify(thought(turn), reasoning["encrypted_content"])
            if turn == 0 and echo == "resign":
                reasoning["encrypted_content"] = "forged"
            items += [{k: v for k, v in item.items() if k != "status"} for item in output]
            items += [{"type": "function_call_output", "call_id": item["call_id"],
                       "output": f"ok {turn}"}
                      for item in output if item["type"] == "function_call"]
        trace = session.trace_json()
    if echo == "resign":
        assert [c.altered_reasoning for c in session.trace.calls] == [0, 1, 1]
        return
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)


# --- the template drops reasoning; the bridge keeps the ids ------------------------------


def test_earlier_reasoning_stays_in_the_prompt_after_a_new_user_query(tiny):
    """Qwen3's template drops reasoning before the last user query; rendering the history in
    full would lose it (and fork). The bridge keeps the sampled ids instead."""
    engine = thinking_policy(tiny, turns=2)
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session()
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                               max_retries=0)
        messages = [{"role": "user", "content": "Fix the bug."}]
        for turn in range(3):
            assistant, _ = ask_chat(client, messages, stream=False)
            messages += [assistant, *({"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                                      for c in assistant["tool_calls"])]
            messages.append({"role": "user", "content": f"Now check again ({turn})."})
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)
    last_prompt = engine.calls[-1]["prompt_ids"]
    assert thought(0) in tiny.tokenizer.decode(last_prompt)
    rendered = proxy.renderer.render_text(
        [{k: v for k, v in m.items() if k != "tool_calls" or v} for m in messages[:-1]],
        add_generation_prompt=True)
    assert thought(0) not in rendered  # what a full re-render would have shown the model


def test_a_sampling_model_streams_its_reasoning_token_by_token(tiny):
    """The real tiny model, its template opening `<think>`: all it samples is reasoning, sent
    as it is sampled, and the trace holds exactly the sampled ids."""
    engine = RecordingEngine(TransformersEngine(
        tiny.model, thinking_tokenizer(opened=True), model_name="tiny-thinking",
        max_context=tiny.max_context, stop_token_ids=tiny.stop_token_ids))
    try:
        with InterceptionProxy(engine) as proxy:
            session = proxy.open_session(sampling={"max_tokens": 12, "seed": 3})
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)
            stream = client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], stream=True)
            reasoning = [c.choices[0].delta.model_extra.get("reasoning_content")
                         for c in stream if c.choices]
            trace = session.trace_json()
    finally:
        engine.inner.close()
    shown = [r for r in reasoning if r]
    assert len(shown) > 1
    (segment,) = trace["segments"]
    assert segment["response_ids"] == engine.calls[0]["token_ids"]
    sampled_text = tiny.tokenizer.decode(segment["response_ids"], skip_special_tokens=True)
    assert "</think>" not in sampled_text  # (a random model: checked, not assumed)
    assert "".join(shown) == sampled_text.strip()
