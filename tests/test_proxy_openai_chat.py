"""The OpenAI Chat surface of the proxy, driven by the official `openai` SDK over real HTTP.

Engines are real: `tiny` samples (random weights), and a `ScriptedEngine` over `tiny` makes the
tool calls a random model never would, its logprobs being tiny's real scores of its tokens.
"""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy
from support.engines import RecordingEngine, tool_call_script

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}


def open_client(proxy: InterceptionProxy, **sampling):
    session = proxy.open_session(sampling=sampling or None)
    return session, openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)


def ask(client, messages, stream: bool, **kw) -> dict:
    """One call; returns the assistant message as a CLI would echo it back."""
    if not stream:
        message = client.chat.completions.create(
            model="policy", messages=messages, tools=[BASH], **kw
        ).choices[0].message
        calls = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls or []
        ]
        return {"role": "assistant", "content": message.content, "tool_calls": calls}
    text, calls = [], []
    for chunk in client.chat.completions.create(
        model="policy", messages=messages, tools=[BASH], stream=True, **kw
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text.append(delta.content or "")
        for call in delta.tool_calls or []:
            calls.append({"id": call.id, "type": "function",
                          "function": {"name": call.function.name,
                                       "arguments": call.function.arguments}})
    return {"role": "assistant", "content": "".join(text), "tool_calls": calls}


def echo_like_a_cli(assistant: dict, empty_content: str | None) -> dict:
    """Re-serialize arguments compactly and send an empty turn as `""` or `None`, as the CLIs do."""
    calls = [
        {**c, "function": {**c["function"],
                           "arguments": json.dumps(json.loads(c["function"]["arguments"]),
                                                   separators=(",", ":"))}}
        for c in assistant["tool_calls"]
    ]
    content = assistant["content"] or empty_content
    out = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    return out


def sampled_spans(segment: dict) -> tuple[list[int], list[float]]:
    ids = [t for t, m in zip(segment["response_ids"], segment["loss_mask"]) if m]
    lps = [p for p, m in zip(segment["response_logprobs"], segment["loss_mask"]) if m]
    return ids, lps


def assert_segment_is_what_the_engine_sampled(segment, recorded_calls, tiny):
    ids, lps = sampled_spans(segment)
    assert ids == [t for c in recorded_calls for t in c["token_ids"]]
    assert lps == [p for c in recorded_calls for p in c["logprobs"]]  # bit-exact
    assert all(p == 0.0 for p, m in zip(segment["response_logprobs"], segment["loss_mask"]) if not m)
    # Each call's prompt is the segment's tokens up to that call: the bridge kept them verbatim.
    tokens = segment["prompt_ids"] + segment["response_ids"]
    for call in recorded_calls:
        assert tokens[: len(call["prompt_ids"])] == call["prompt_ids"]
    # Re-scoring the whole segment under the same weights reproduces p_old.
    rescored = tiny.score(segment["prompt_ids"], segment["response_ids"])
    rescored_sampled = [r for r, m in zip(rescored, segment["loss_mask"]) if m]
    assert max(abs(a - b) for a, b in zip(rescored_sampled, lps)) < 1e-4


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_five_turn_tool_conversation_is_one_segment_of_the_engines_exact_tokens(tiny, stream):
    engine = RecordingEngine(ScriptedEngine(tiny, tool_call_script(turns=5)))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        messages = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]}]
        for turn in range(5):
            assistant = ask(client, messages, stream)
            if turn < 4:
                assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["bash"]
                messages.append(echo_like_a_cli(assistant, None if turn % 2 else ""))
                call_id = assistant["tool_calls"][0]["id"]
                messages.append({"role": "tool", "tool_call_id": call_id, "content": f"ok {turn}"})
            else:
                assert assistant["content"] == "All done." and not assistant["tool_calls"]
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert trace["n_llm_calls"] == 5 and trace["n_tool_calls"] == 4
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_sampled_multi_turn_chat_with_tiny_is_one_segment_and_rescores(tiny, stream):
    engine = RecordingEngine(tiny)
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy, max_tokens=12, temperature=1.0)
        messages = [SYSTEM, {"role": "user", "content": "hello"}]
        for turn in range(5):
            assistant = ask(client, messages, stream, seed=turn)
            messages.append(echo_like_a_cli(assistant, ""))
            messages.append({"role": "user", "content": f"and then {turn}?"})
        trace = session.trace_json()
    assert len(trace["segments"]) == 1
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)


def test_streamed_and_plain_answers_with_the_same_seed_carry_the_same_tokens(tiny):
    with InterceptionProxy(tiny) as proxy:
        traces = []
        for stream in (False, True):
            session, client = open_client(proxy, max_tokens=16)
            ask(client, [SYSTEM, {"role": "user", "content": "hi"}], stream, seed=7)
            traces.append(session.trace_json()["segments"][0])
    assert traces[0]["response_ids"] == traces[1]["response_ids"]
    # Equal to float rounding: the later calls reuse the engine's prefix KV cache.
    assert traces[0]["response_logprobs"] == pytest.approx(
        traces[1]["response_logprobs"], abs=1e-5)


def test_changing_an_earlier_message_starts_a_second_segment(tiny):
    engine = ScriptedEngine(tiny, tool_call_script(turns=10))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        messages = [SYSTEM, {"role": "user", "content": "Fix the bug."}]
        for turn in range(3):
            assistant = ask(client, messages, stream=False)
            messages.append(echo_like_a_cli(assistant, ""))
            messages.append({"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                             "content": "x" * 50})
        # Compaction: the CLI summarises the first tool result.
        messages[3] = {**messages[3], "content": "[output elided]"}
        assistant = ask(client, messages, stream=False)
        messages.append(echo_like_a_cli(assistant, ""))
        messages.append({"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                         "content": "y"})
        ask(client, messages, stream=False)  # continues the compacted history
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent", "agent"]
    assert [s["n_calls"] for s in trace["segments"]] == [3, 2]


def test_a_resent_request_does_not_fork_and_the_abandoned_answer_is_discarded(tiny):
    engine = RecordingEngine(ScriptedEngine(tiny, tool_call_script(turns=10)))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        messages = [SYSTEM, {"role": "user", "content": "Fix the bug."}]
        assistant = ask(client, messages, stream=False)
        messages.append(echo_like_a_cli(assistant, ""))
        messages.append({"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                         "content": "ok"})
        ask(client, messages, stream=True)
        retried = ask(client, messages, stream=True)  # the client retries the same request
        messages.append(echo_like_a_cli(retried, ""))
        messages.append({"role": "tool", "tool_call_id": retried["tool_calls"][0]["id"],
                         "content": "ok"})
        ask(client, messages, stream=False)
        trace = session.trace_json()
    roles = [s["role"] for s in trace["segments"]]
    assert roles == ["agent", "discarded"]
    agent = trace["segments"][0]
    assert agent["n_calls"] == 3
    kept = [engine.calls[i] for i in (0, 2, 3)]  # call 1 was abandoned by the retry
    assert_segment_is_what_the_engine_sampled(agent, kept, tiny)
    assert trace["segments"][1]["response_ids"] == engine.calls[1]["token_ids"]


@pytest.mark.parametrize("empty_content", ["", None, "omitted"])
def test_an_echoed_tool_call_with_reserialized_arguments_extends_the_segment(tiny, empty_content):
    def script(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "done"
        return '<tool_call>\n{"name": "bash", "arguments": {"a": 1, "b": [1, 2]}}\n</tool_call>'

    engine = RecordingEngine(ScriptedEngine(tiny, script))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        messages = [{"role": "user", "content": "go"}]
        assistant = ask(client, messages, stream=True)
        assert assistant["content"] == ""
        echoed = echo_like_a_cli(assistant, None if empty_content == "omitted" else empty_content)
        assert echoed["tool_calls"][0]["function"]["arguments"] == '{"a":1,"b":[1,2]}'
        if empty_content == "omitted":
            del echoed["content"]
        messages += [echoed, {"role": "tool", "tool_call_id": echoed["tool_calls"][0]["id"],
                              "content": "1"}]
        ask(client, messages, stream=False)
        trace = session.trace_json()
    assert len(trace["segments"]) == 1
    first, second = engine.calls
    assert second["prompt_ids"][: len(first["prompt_ids"]) + len(first["token_ids"])] == (
        first["prompt_ids"] + first["token_ids"]
    )


# --- errors: each in OpenAI's shape, none leaves a trace entry ----------------------------


@pytest.fixture(scope="module")
def small_context_proxy(tiny):
    engine = ScriptedEngine(tiny, lambda prompt: "ok")
    engine.max_context = 200
    with InterceptionProxy(engine) as proxy:
        yield proxy


def post(proxy, body, key):
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(proxy.base_url + "/chat/completions", content=content, headers=headers)


GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "body, param",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        ({"model": "m"}, "messages"),
        ({**GOOD, "messages": "hi"}, "messages"),
        ({**GOOD, "messages": []}, "messages"),
        ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({**GOOD, "temperature": "hot"}, "temperature"),
        ({**GOOD, "max_tokens": "many"}, "max_tokens"),
        ({**GOOD, "stream": "yes"}, "stream"),
        ({**GOOD, "tools": {"bash": 1}}, "tools"),
        ({**GOOD, "tools": [{"type": "function", "function": {"description": "x"}}]},
         "tools[0].function.name"),
        ({**GOOD, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ],
)
def test_a_bad_request_gets_a_400_in_openai_shape_and_no_trace_entry(small_context_proxy, body, param):
    session = small_context_proxy.open_session()
    response = post(small_context_proxy, body, session.session_id)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert session.trace_json()["segments"] == [] and session.trace.calls == []


def test_an_unknown_key_gets_401_and_the_sdk_raises_authentication_error(small_context_proxy):
    response = post(small_context_proxy, GOOD, "not-a-session")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    client = openai.OpenAI(base_url=small_context_proxy.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=GOOD["messages"])


def test_a_prompt_longer_than_the_context_gets_the_context_length_error(small_context_proxy):
    session = small_context_proxy.open_session()
    long_body = {**GOOD, "messages": [{"role": "user", "content": "word " * 400}]}
    response = post(small_context_proxy, long_body, session.session_id)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 200 tokens" in error["message"]
    assert session.trace.calls == []
    client = openai.OpenAI(base_url=small_context_proxy.base_url, api_key=session.session_id,
                           max_retries=0)
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.chat.completions.create(model="m", messages=long_body["messages"], stream=True)


def test_two_concurrent_sessions_never_see_each_others_calls(tiny):
    engine = ScriptedEngine(tiny, tool_call_script(turns=4))
    with InterceptionProxy(engine) as proxy:
        sessions = {}

        def converse(marker: str) -> None:
            session, client = open_client(proxy)
            sessions[marker] = session
            messages = [{"role": "user", "content": f"task {marker}"}]
            for turn in range(4):
                assistant = ask(client, messages, stream=turn % 2 == 0)
                if not assistant["tool_calls"]:
                    break
                messages.append(echo_like_a_cli(assistant, ""))
                messages.append({"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                                 "content": f"result {marker}"})

        threads = [threading.Thread(target=converse, args=(m,)) for m in ("alpha", "omega")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for mine, other in (("alpha", "omega"), ("omega", "alpha")):
            (segment,) = sessions[mine].trace_json()["segments"]
            text = tiny.tokenizer.decode(segment["prompt_ids"] + segment["response_ids"])
            assert f"task {mine}" in text and other not in text
            assert segment["n_calls"] == 4


def test_admin_routes_open_trace_and_close_sessions(tiny):
    with InterceptionProxy(tiny, admin_key="secret") as proxy:
        admin = {"authorization": "Bearer secret"}
        assert httpx.post(proxy.url + "/sessions", json={}).status_code == 401
        created = httpx.post(
            proxy.url + "/sessions", headers=admin,
            json={"policy_version": 3, "sampling": {"max_tokens": 5, "temperature": 0}},
        )
        assert created.status_code == 201
        info = created.json()
        assert info["base_url"] == proxy.base_url and info["api_key"] == info["session_id"]
        client = openai.OpenAI(base_url=info["base_url"], api_key=info["api_key"], max_retries=0)
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert answer.usage.completion_tokens == 5
        trace = httpx.get(f"{proxy.url}/sessions/{info['session_id']}/trace", headers=admin).json()
        assert trace["session_id"] == info["session_id"]
        (segment,) = trace["segments"]
        assert segment["policy_version"] == 3 and len(segment["response_ids"]) == 5
        assert set(segment) >= {"prompt_ids", "response_ids", "loss_mask", "response_logprobs",
                                "policy_version", "role"}
        bad = httpx.post(proxy.url + "/sessions", headers=admin, json={"sampling": {"top_p": "x"}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "sampling.top_p"
        gone = httpx.delete(f"{proxy.url}/sessions/{info['session_id']}", headers=admin)
        assert gone.status_code == 200
        missing = httpx.get(f"{proxy.url}/sessions/{info['session_id']}/trace", headers=admin)
        assert missing.status_code == 404
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_models_lists_the_engine_and_usage_is_sent_only_when_asked(tiny):
    with InterceptionProxy(tiny) as proxy:
        session, client = open_client(proxy, max_tokens=3)
        assert [m.id for m in client.models.list()] == [tiny.model_name]
        messages = [{"role": "user", "content": "x"}]
        plain = list(client.chat.completions.create(model="m", messages=messages, stream=True))
        assert all(c.usage is None for c in plain)
        with_usage = list(client.chat.completions.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}))
        assert with_usage[-1].usage.completion_tokens == 3 and with_usage[-1].choices == []
        assert with_usage[-2].choices[0].finish_reason == "length"
