"""The Anthropic Messages surface of the proxy, driven by the official `anthropic` SDK over HTTP.

Conversations are echoed back the way Claude Code does it: the assistant's blocks as the SDK
parsed them (`tool_use` with an `input` object, never raw text), the `thinking` blocks it got,
tool results as `tool_result` blocks, and a `role: "system"` message inside `messages`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

import anthropic
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.engines import RecordingEngine, tool_call_script
from test_proxy_openai_chat import assert_segment_is_what_the_engine_sampled

from harness_gym.engines import Engine, RequestContext, SamplingParams, TokenChunk
from harness_gym.engines.base import EngineError
from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy

BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    "cache_control": {"type": "ephemeral"},
}
SYSTEM = [{"type": "text", "text": "You are a careful coding agent.",
           "cache_control": {"type": "ephemeral"}}]


def open_client(proxy: InterceptionProxy, **sampling):
    session = proxy.open_session(sampling=sampling or None)
    client = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id, max_retries=0)
    return session, client


def ask(client, messages, mode: str, **kw) -> anthropic.types.Message:
    """One call through the SDK in one of its three ways of reading an answer."""
    kw = {"model": "policy", "max_tokens": 256, "system": SYSTEM, "messages": messages,
          "tools": [BASH], **kw}
    if mode == "create":
        return client.messages.create(**kw)
    if mode == "stream":
        with client.messages.stream(**kw) as stream:
            for _ in stream:
                pass
            return stream.get_final_message()
    events = list(client.messages.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    # Rebuild the message from the raw events, as a CLI without the SDK's helper does.
    blocks: list[dict] = []
    for event in events:
        if event.type == "content_block_start":
            blocks.append(event.content_block.model_dump(exclude_none=True))
            blocks[-1]["partial"] = ""
        elif event.type == "content_block_delta":
            if event.delta.type == "text_delta":
                blocks[-1]["text"] += event.delta.text
            else:
                blocks[-1]["partial"] += event.delta.partial_json
    for block in blocks:
        partial = block.pop("partial")
        if block["type"] == "tool_use":
            block["input"] = json.loads(partial)
    final = events[-2]
    return anthropic.types.Message(
        id=events[0].message.id, type="message", role="assistant", model="policy",
        content=blocks, stop_reason=final.delta.stop_reason, stop_sequence=None,
        usage={"input_tokens": events[0].message.usage.input_tokens,
               "output_tokens": final.usage.output_tokens},
    )


def echo_like_claude_code(message: anthropic.types.Message) -> dict:
    blocks = []
    for block in message.content:
        if block.type == "thinking":
            blocks.append({"type": "thinking", "thinking": block.thinking,
                           "signature": block.signature})
        elif block.type == "text":
            blocks.append({"type": "text", "text": block.text})
        else:
            blocks.append({"type": "tool_use", "id": block.id, "name": block.name,
                           "input": block.input, "cache_control": {"type": "ephemeral"}})
    return {"role": "assistant", "content": blocks}


def tool_results(message: anthropic.types.Message, text: str, note: str | None = None) -> dict:
    blocks = [
        {"type": "tool_result", "tool_use_id": b.id,
         "content": [{"type": "text", "text": text}], "is_error": False}
        for b in message.content if b.type == "tool_use"
    ]
    if note:
        blocks.append({"type": "text", "text": note})
    return {"role": "user", "content": blocks}


@pytest.mark.parametrize("mode", ["create", "stream", "raw-events"])
def test_a_five_turn_tool_conversation_is_one_segment_of_the_engines_exact_tokens(tiny, mode):
    engine = RecordingEngine(ScriptedEngine(tiny, tool_call_script(turns=5)))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        messages = [
            {"role": "system", "content": "Claude Code's own system message."},
            {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
        ]
        for turn in range(5):
            answer = ask(client, messages, mode)
            if turn < 4:
                assert answer.stop_reason == "tool_use"
                (call,) = [b for b in answer.content if b.type == "tool_use"]
                assert call.name == "bash" and call.id.startswith("toolu_")
                assert call.input == {"command": f"echo step{turn} > out{turn}.txt"}
                messages.append(echo_like_claude_code(answer))
                messages.append(tool_results(answer, f"ok {turn}", "go on" if turn == 2 else None))
            else:
                assert [b.text for b in answer.content] == ["All done."]
                assert answer.stop_reason == "end_turn"
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert trace["n_llm_calls"] == 5 and trace["n_tool_calls"] == 4
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)
    assert answer.usage.input_tokens == len(engine.calls[-1]["prompt_ids"])
    assert answer.usage.output_tokens == len(engine.calls[-1]["token_ids"])


def test_tool_results_become_tool_messages_in_order_then_the_text_beside_them(tiny):
    engine = RecordingEngine(ScriptedEngine(tiny, lambda prompt: "ok"))
    with InterceptionProxy(engine) as proxy:
        _, client = open_client(proxy)
        client.messages.create(model="m", max_tokens=8, messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "a"}},
                {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "b"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "first"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                 "content": [{"type": "text", "text": "second"}]},
                {"type": "text", "text": "and a note"}]},
        ], tools=[BASH])
    prompt = tiny.tokenizer.decode(engine.calls[0]["prompt_ids"])
    assert prompt.index("first") < prompt.index("second") < prompt.index("and a note")
    assert prompt.count("<tool_response>") == 2


def test_a_compacted_history_makes_exactly_two_segments(tiny):
    engine = ScriptedEngine(tiny, tool_call_script(turns=10))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        messages = [{"role": "user", "content": "Fix the bug."}]
        for _ in range(3):
            answer = ask(client, messages, "create")
            messages += [echo_like_claude_code(answer), tool_results(answer, "x" * 50)]
        messages[2] = {**messages[2], "content": [{**messages[2]["content"][0],
                                                   "content": "[output elided]"}]}
        for _ in range(2):
            answer = ask(client, messages, "stream")
            messages += [echo_like_claude_code(answer), tool_results(answer, "y")]
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent", "agent"]
    assert [s["n_calls"] for s in trace["segments"]] == [3, 2]


def test_streamed_and_plain_answers_with_the_same_seed_carry_the_same_tokens(tiny):
    with InterceptionProxy(tiny) as proxy:
        traces, texts = [], []
        for mode in ("create", "stream", "raw-events"):
            session, client = open_client(proxy, seed=7, max_tokens=16, temperature=1.0)
            answer = ask(client, [{"role": "user", "content": "hi"}], mode)
            texts.append([b.model_dump(exclude={"citations"}) for b in answer.content])
            traces.append(session.trace_json()["segments"][0])
    assert traces[0]["response_ids"] == traces[1]["response_ids"] == traces[2]["response_ids"]
    # Equal to float rounding: the later calls reuse the engine's prefix KV cache.
    assert traces[0]["response_logprobs"] == pytest.approx(
        traces[1]["response_logprobs"], abs=1e-5)
    assert texts[0] == texts[1] == texts[2]
    assert answer.stop_reason == "max_tokens"


def test_count_tokens_is_the_real_prompt_length_and_records_nothing(tiny):
    engine = RecordingEngine(ScriptedEngine(tiny, lambda prompt: "ok"))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        messages = [{"role": "user", "content": "count me"}]
        counted = client.messages.count_tokens(model="m", system=SYSTEM, messages=messages,
                                               tools=[BASH])
        assert session.trace.calls == [] and engine.calls == []
        ask(client, messages, "create")
    assert counted.input_tokens == len(engine.calls[0]["prompt_ids"])


def test_a_stop_sequence_ends_the_answer_and_is_reported(tiny):
    engine = ScriptedEngine(tiny, lambda prompt: "alpha beta STOP gamma")
    with InterceptionProxy(engine) as proxy:
        _, client = open_client(proxy)
        for mode in ("create", "stream"):
            answer = ask(client, [{"role": "user", "content": "x"}], mode,
                         stop_sequences=["STOP"])
            assert answer.stop_reason == "stop_sequence" and answer.stop_sequence == "STOP"
            assert answer.content[0].text == "alpha beta"  # trailing space held back, as ever


def test_probe_paths_and_head_answer_quietly(tiny):
    with InterceptionProxy(tiny) as proxy:
        assert httpx.head(proxy.url + "/").status_code == 200
        assert httpx.head(proxy.url + "/v1/nowhere").status_code == 404
        missing = httpx.get(proxy.url + "/api/v1/models")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


# --- errors: each in Anthropic's shape, none leaves a trace entry -------------------------


@pytest.fixture(scope="module")
def small_context_proxy(tiny):
    engine = ScriptedEngine(tiny, lambda prompt: "ok")
    engine.max_context = 200
    with InterceptionProxy(engine) as proxy:
        yield proxy


def post(proxy, body, key, path="/v1/messages?beta=true"):
    headers = {"x-api-key": key, "content-type": "application/json",
               "anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking"}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(proxy.url + path, content=content, headers=headers)


GOOD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def test_unknown_fields_and_server_tools_are_tolerated(small_context_proxy):
    session = small_context_proxy.open_session()
    body = {**GOOD, "metadata": {"user_id": "u"}, "context_management": {"edits": []},
            "thinking": {"type": "enabled", "budget_tokens": 1024}, "output_config": {},
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "auto"}, "top_k": 5}
    response = post(small_context_proxy, body, session.session_id)
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": "ok"}]


def test_the_raw_stream_is_anthropics_full_event_sequence(tiny):
    engine = ScriptedEngine(tiny, tool_call_script(turns=2))
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session()
        body = {**GOOD, "max_tokens": 200, "stream": True, "tools": [BASH]}
        response = post(proxy, body, session.session_id)
    events = [(e.split("\n")[0], json.loads(e.split("\n")[1][6:]))
              for e in response.text.strip().split("\n\n")]
    kinds = [k.removeprefix("event: ") for k, _ in events]
    assert all(kind == data["type"] for kind, (_, data) in zip(kinds, events))
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-5:] == ["content_block_start", "content_block_delta", "content_block_stop",
                          "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0
    tool_start, tool_delta = events[-5][1], events[-4][1]
    assert tool_start["index"] == 1 and tool_start["content_block"]["type"] == "tool_use"
    assert json.loads(tool_delta["delta"]["partial_json"]) == {"command": "echo step0 > out0.txt"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"]["output_tokens"] == session.trace.calls[0].completion_tokens


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{not json", "JSON"),
        (b"[1, 2]", "object"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({**GOOD, "max_tokens": "many"}, "max_tokens"),
        ({**GOOD, "max_tokens": 0}, "max_tokens"),
        ({**GOOD, "messages": "hi"}, "messages"),
        ({**GOOD, "messages": []}, "messages"),
        ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
        ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "content"),
        # Images are accepted (test_proxy_images); a malformed one is still refused.
        ({**GOOD, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "source.type"),
        ({**GOOD, "system": 3}, "system"),
        ({**GOOD, "temperature": "hot"}, "temperature"),
        ({**GOOD, "temperature": 1.5}, "temperature"),
        ({**GOOD, "stream": "yes"}, "stream"),
        ({**GOOD, "stop_sequences": "STOP"}, "stop_sequences"),
        ({**GOOD, "tools": [{"name": "bash"}]}, "input_schema"),
        ({**GOOD, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
         "tool_use_id"),
    ],
)
def test_a_bad_request_gets_a_400_in_anthropic_shape_and_no_trace_entry(
    small_context_proxy, body, words
):
    session = small_context_proxy.open_session()
    response = post(small_context_proxy, body, session.session_id)
    assert response.status_code == 400
    payload = response.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert words in payload["error"]["message"]
    assert session.trace.calls == []


def test_an_unknown_key_gets_401_and_the_sdk_raises_authentication_error(small_context_proxy):
    response = post(small_context_proxy, GOOD, "not-a-session")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    client = anthropic.Anthropic(base_url=small_context_proxy.url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(**GOOD)
    bearer = anthropic.Anthropic(base_url=small_context_proxy.url, auth_token="nope",
                                 max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bearer.messages.create(**GOOD)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_gets_claude_codes_compaction_error(
    small_context_proxy, stream
):
    session, client = open_client(small_context_proxy)
    body = {**GOOD, "messages": [{"role": "user", "content": "word " * 400}]}
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            with client.messages.stream(**body) as events:
                list(events)
        else:
            client.messages.create(**body)
    assert caught.value.status_code == 400
    message = caught.value.body["error"]["message"]
    assert message.startswith("prompt is too long: ") and message.endswith(" tokens > 200 maximum")
    assert int(message.split()[4]) > 200
    assert session.trace.calls == []


class BrokenEngine(Engine):
    """A real tokenizer in front of an engine that is down, or dies after `after` tokens."""

    def __init__(self, inner: Engine, after: int | None) -> None:
        self.inner, self.after = inner, after
        self.model_name, self.max_context = inner.model_name, inner.max_context
        self.stop_token_ids = inner.stop_token_ids

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams,
               context: RequestContext = RequestContext()) -> AsyncIterator[TokenChunk]:
        return self._stream(prompt_ids, sampling)

    async def _stream(self, prompt_ids, sampling) -> AsyncIterator[TokenChunk]:
        if self.after is None:
            raise EngineError("connection refused")
        n = 0
        async for chunk in self.inner.stream(prompt_ids, sampling):
            if n == self.after:
                raise EngineError("the engine died")
            n += 1
            yield chunk


def test_an_engine_that_is_down_gets_a_529_overloaded_error(tiny):
    with InterceptionProxy(BrokenEngine(tiny, None)) as proxy:
        session, client = open_client(proxy)
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(**GOOD)
        assert caught.value.status_code == 529
        assert caught.value.body["error"]["type"] == "overloaded_error"
        assert session.trace.calls == []
        assert session.trace.engine_failures == ["connection refused"]  # the episode's: ours


def test_a_failure_mid_stream_is_an_error_event(tiny):
    with InterceptionProxy(BrokenEngine(tiny, 3)) as proxy:
        session, client = open_client(proxy, max_tokens=10)
        response = post(proxy, {**GOOD, "max_tokens": 10, "stream": True}, session.session_id)
        assert response.status_code == 200
        assert "event: message_start" in response.text
        assert 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"' in (
            response.text)
        stream = client.messages.stream(**{**GOOD, "max_tokens": 10})
        with pytest.raises(anthropic.APIStatusError), stream as events:
            list(events)
        assert {c.kind for c in session.trace.calls} == {"aborted"}
        assert session.trace.engine_failures == ["the engine died"] * 2


# --- fuzz: every body gets a shaped 4xx or a valid answer, never a 500 --------------------

# Any JSON value, for fields a fuzzed body gets wrong.
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.floats(-1, 3) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8,
)
_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.text(max_size=5),
                           "name": st.sampled_from(["bash", "x"]),
                           "input": st.dictionaries(st.text(max_size=4), ANY_JSON, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.text(max_size=5),
                           "content": st.text(max_size=10) | st.lists(
                               st.fixed_dictionaries({"type": st.just("text"),
                                                      "text": st.text(max_size=5)}), max_size=2)}),
    st.fixed_dictionaries({"type": st.sampled_from(["thinking", "image", "weird"])}),
    ANY_JSON,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool"]),
     "content": st.text(max_size=20) | st.lists(_block, max_size=3) | ANY_JSON}
)
_wild_body = st.fixed_dictionaries(
    {"messages": st.lists(_message, max_size=4) | ANY_JSON},
    optional={"model": st.text(max_size=5) | ANY_JSON, "max_tokens": st.integers(-1, 8) | ANY_JSON,
              "system": st.text(max_size=10) | st.lists(_block, max_size=2) | ANY_JSON,
              "stream": st.booleans() | ANY_JSON, "temperature": st.floats(-1, 2) | ANY_JSON,
              "top_p": ANY_JSON, "top_k": ANY_JSON, "stop_sequences": st.lists(st.text(max_size=3),
                                                                        max_size=2) | ANY_JSON,
              "tools": st.lists(st.just(BASH) | ANY_JSON, max_size=2) | ANY_JSON,
              "tool_choice": ANY_JSON, "metadata": ANY_JSON, "cache_control": ANY_JSON},
)
_text_block = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)})
# Well-formed bodies, so that a good share of the cases reach the model and its answer.
_valid_body = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, 8),
     "messages": st.lists(st.fixed_dictionaries(
         {"role": st.sampled_from(["user", "assistant", "system"]),
          "content": st.text(max_size=20) | st.lists(_text_block, max_size=2)}),
         min_size=1, max_size=3)},
    optional={"model": st.text(max_size=5), "system": st.text(max_size=10),
              "stream": st.booleans(), "temperature": st.floats(0, 1),
              "stop_sequences": st.lists(st.text(min_size=1, max_size=3), max_size=2),
              "tools": st.lists(st.just(BASH), max_size=1), "metadata": ANY_JSON,
              "thinking": ANY_JSON, "tool_choice": st.just({"type": "auto"})},
)
_body = st.one_of(_valid_body, *[_wild_body] * 4)  # a fifth are well-formed


def test_fuzzed_bodies_get_a_shaped_4xx_or_a_valid_answer(tiny):
    engine = ScriptedEngine(tiny, lambda prompt: "ok")
    answered = []
    with InterceptionProxy(engine) as proxy, httpx.Client(base_url=proxy.url) as http:
        session = proxy.open_session(sampling={"max_tokens": 2})
        headers = {"x-api-key": session.session_id}

        @settings(max_examples=1000, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(body=_body, path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
        def check(body, path):
            response = http.post(path, json=body, headers=headers)
            assert response.status_code in (200, 400), response.text
            if response.status_code == 400:
                error = response.json()
                assert error["type"] == "error"
                assert error["error"]["type"] == "invalid_request_error"
                assert error["error"]["message"]
                return
            answered.append(body)
            if path.endswith("count_tokens"):
                assert response.json()["input_tokens"] > 0
            elif body.get("stream") is True:
                assert response.text.startswith("event: message_start")
                assert response.text.rstrip().endswith('data: {"type":"message_stop"}')
            else:
                assert response.json()["type"] == "message"

        check()
    assert len(answered) >= 50  # the fuzz reaches the model, not only the validators
