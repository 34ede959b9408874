"""The OpenAI Responses surface of the proxy, driven by the official `openai` SDK over HTTP.

Conversations are echoed back as a stateless Responses client (Pi, Codex with `store: false`)
does: the output items as the SDK parsed them, then `function_call_output` items.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.engines import RecordingEngine, tool_call_script
from test_proxy_anthropic import ANY_JSON, BrokenEngine
from test_proxy_openai_chat import assert_segment_is_what_the_engine_sampled

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy

BASH = {
    "type": "function",
    "name": "bash",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    "strict": False,
}
INSTRUCTIONS = "You are a careful coding agent."


def open_client(proxy: InterceptionProxy, **sampling):
    session = proxy.open_session(sampling=sampling or None)
    return session, openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                  max_retries=0)


def ask(client, items, stream: bool, **kw) -> list[dict]:
    """One call; returns the output items as a client would echo them back."""
    kw = {"model": "policy", "input": items, "instructions": INSTRUCTIONS, "tools": [BASH],
          "store": False, **kw}
    if not stream:
        response = client.responses.create(**kw)
        assert response.status in ("completed", "incomplete")
        return [item.model_dump(exclude_none=True) for item in response.output]
    events = list(client.responses.create(stream=True, **kw))
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type in ("response.completed", "response.incomplete")
    done = [e.item.model_dump(exclude_none=True) for e in events
            if e.type == "response.output_item.done"]
    assert done == [item.model_dump(exclude_none=True) for item in events[-1].response.output]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    texts = "".join(c["text"] for i in done if i["type"] == "message" for c in i["content"])
    assert deltas == texts
    return done


def echo(output: list[dict]) -> list[dict]:
    items = []
    for item in output:
        if item["type"] == "message":
            items.append({"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": c["text"]} for c in item["content"]]})
        else:
            arguments = json.dumps(json.loads(item["arguments"]), separators=(",", ":"))
            items.append({"type": "function_call", "call_id": item["call_id"],
                          "name": item["name"], "arguments": arguments})
    return items


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_five_turn_tool_conversation_is_one_segment_of_the_engines_exact_tokens(tiny, stream):
    engine = RecordingEngine(ScriptedEngine(tiny, tool_call_script(turns=5)))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        items: list[dict] = [{"role": "user", "content": [
            {"type": "input_text", "text": "Fix the bug."}]}]
        for turn in range(5):
            output = ask(client, items, stream)
            calls = [i for i in output if i["type"] == "function_call"]
            if turn < 4:
                assert [c["name"] for c in calls] == ["bash"]
                assert json.loads(calls[0]["arguments"]) == {
                    "command": f"echo step{turn} > out{turn}.txt"}
                items += [{"type": "reasoning", "summary": []}, *echo(output)]
                items.append({"type": "function_call_output", "call_id": calls[0]["call_id"],
                              "output": f"ok {turn}"})
            else:
                assert not calls and output[0]["content"][0]["text"] == "All done."
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert trace["n_llm_calls"] == 5 and trace["n_tool_calls"] == 4
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)


def test_a_compacted_history_makes_exactly_two_segments(tiny):
    engine = ScriptedEngine(tiny, tool_call_script(turns=10))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        items: list[dict] = [{"role": "user", "content": "Fix the bug."}]
        for stream in (False, True, False, True, False):
            if len(items) == 10:  # after three calls the client summarises the first result
                items[3] = {**items[3], "output": "[output elided]"}
            output = ask(client, items, stream)
            call = next(i for i in output if i["type"] == "function_call")
            items += [*echo(output), {"type": "function_call_output",
                                      "call_id": call["call_id"], "output": "x" * 50}]
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent", "agent"]
    assert [s["n_calls"] for s in trace["segments"]] == [3, 2]


def test_streamed_and_plain_answers_with_the_same_seed_carry_the_same_tokens(tiny):
    with InterceptionProxy(tiny) as proxy:
        traces, outputs = [], []
        for stream in (False, True):
            session, client = open_client(proxy, seed=7, max_tokens=16, temperature=1.0)
            output = ask(client, "hi", stream)
            outputs.append([{k: v for k, v in i.items() if k != "id"} for i in output])
            traces.append(session.trace_json()["segments"][0])
    assert traces[0]["response_ids"] == traces[1]["response_ids"]
    # Equal to float rounding: the later calls reuse the engine's prefix KV cache.
    assert traces[0]["response_logprobs"] == pytest.approx(
        traces[1]["response_logprobs"], abs=1e-5)
    assert outputs[0] == outputs[1]


def test_max_output_tokens_makes_an_incomplete_response(tiny):
    with InterceptionProxy(tiny) as proxy:
        _, client = open_client(proxy)
        response = client.responses.create(model="m", input="hi", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3
    assert response.usage.total_tokens == response.usage.input_tokens + 3


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
    return httpx.post(proxy.base_url + "/responses", content=content, headers=headers)


GOOD = {"model": "m", "input": "hi"}


@pytest.mark.parametrize(
    "body, param",
    [
        (b"{not json", None),
        ({"model": "m"}, "input"),
        ({**GOOD, "input": 5}, "input"),
        ({**GOOD, "input": []}, "input"),
        ({**GOOD, "input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        # Images are accepted (test_proxy_images); one with no image is still refused.
        ({**GOOD, "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0].image_url"),
        ({**GOOD, "input": [{"type": "function_call", "name": "bash", "arguments": "{}"}]},
         "input[0].call_id"),
        ({**GOOD, "input": [{"type": "function_call_output", "output": "x"}]},
         "input[0].call_id"),
        ({**GOOD, "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({**GOOD, "previous_response_id": "resp_1"}, "previous_response_id"),
        ({**GOOD, "max_output_tokens": "many"}, "max_output_tokens"),
        ({**GOOD, "temperature": "hot"}, "temperature"),
        ({**GOOD, "tools": [{"type": "function", "description": "x"}]}, "tools[0].name"),
    ],
)
def test_a_bad_request_gets_a_400_in_openai_shape_and_no_trace_entry(
    small_context_proxy, body, param
):
    session = small_context_proxy.open_session()
    response = post(small_context_proxy, body, session.session_id)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert session.trace.calls == []


def test_hosted_tools_and_unknown_fields_are_tolerated(small_context_proxy):
    session = small_context_proxy.open_session()
    body = {**GOOD, "tools": [{"type": "web_search"}, BASH], "reasoning": {"effort": "low"},
            "include": ["reasoning.encrypted_content"], "store": False, "text": {},
            "parallel_tool_calls": True, "tool_choice": "auto", "prompt_cache_key": "k"}
    response = post(small_context_proxy, body, session.session_id)
    assert response.status_code == 200, response.text
    assert response.json()["output"][0]["content"][0]["text"] == "ok"


def test_an_unknown_key_gets_401_and_the_sdk_raises_authentication_error(small_context_proxy):
    client = openai.OpenAI(base_url=small_context_proxy.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.responses.create(**GOOD)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_gets_the_context_length_error(
    small_context_proxy, stream
):
    session, client = open_client(small_context_proxy)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 200 tokens") as e:
        client.responses.create(model="m", input="word " * 400, stream=stream)
    assert e.value.code == "context_length_exceeded"
    assert session.trace.calls == []


def test_an_engine_that_is_down_or_dies_mid_stream_gets_an_overloaded_error(tiny):
    with InterceptionProxy(BrokenEngine(tiny, None)) as proxy:
        _, client = open_client(proxy)
        with pytest.raises(openai.InternalServerError) as caught:
            client.responses.create(**GOOD)
        assert caught.value.status_code == 503
    with InterceptionProxy(BrokenEngine(tiny, 3)) as proxy:
        session, client = open_client(proxy, max_tokens=10)
        events = list(client.responses.create(**GOOD, stream=True))
        assert events[-2].type == "error" and events[-2].code == "overloaded"
        assert events[-1].type == "response.failed"
        assert {c.kind for c in session.trace.calls} == {"aborted"}


# --- fuzz: every body gets a shaped 4xx or a valid answer, never a 500 --------------------

_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image", "x"]),
     "text": st.text(max_size=10) | ANY_JSON}
) | ANY_JSON
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer", "tool"]),
                           "content": st.text(max_size=10) | st.lists(_part, max_size=2) | ANY_JSON},
                          optional={"type": st.just("message")}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.text(max_size=4),
                           "name": st.sampled_from(["bash", "x"]),
                           "arguments": st.sampled_from(["{}", '{"a": 1}', "{bad", ""]) | ANY_JSON}),
    st.fixed_dictionaries({"type": st.just("function_call_output"),
                           "call_id": st.text(max_size=4) | ANY_JSON,
                           "output": st.text(max_size=10) | st.lists(_part, max_size=2) | ANY_JSON}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference"])}),
    ANY_JSON,
)
_body = st.fixed_dictionaries(
    {"input": st.text(max_size=10) | st.lists(_item, max_size=4) | ANY_JSON},
    optional={"model": st.text(max_size=5) | ANY_JSON, "instructions": st.text(max_size=10) | ANY_JSON,
              "max_output_tokens": st.integers(-1, 8) | ANY_JSON, "stream": st.booleans() | ANY_JSON,
              "temperature": st.floats(-1, 3) | ANY_JSON, "top_p": ANY_JSON,
              "tools": st.lists(st.just(BASH) | ANY_JSON, max_size=2) | ANY_JSON,
              "metadata": ANY_JSON, "previous_response_id": st.none() | st.text(max_size=3)},
)


def test_fuzzed_bodies_get_a_shaped_4xx_or_a_valid_answer(tiny):
    engine = ScriptedEngine(tiny, lambda prompt: "ok")
    answered = []
    with InterceptionProxy(engine) as proxy, httpx.Client(base_url=proxy.base_url) as http:
        session = proxy.open_session(sampling={"max_tokens": 2})
        headers = {"authorization": f"Bearer {session.session_id}"}

        @settings(max_examples=1000, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(body=_body)
        def check(body):
            response = http.post("/responses", json=body, headers=headers)
            assert response.status_code in (200, 400), response.text
            if response.status_code == 400:
                error = response.json()["error"]
                assert error["type"] == "invalid_request_error" and error["message"]
                return
            answered.append(body)
            if body.get("stream") is True:
                assert response.text.startswith("event: response.created")
                assert "event: response.completed" in response.text or (
                    "event: response.incomplete" in response.text)
            else:
                assert response.json()["object"] == "response"

        check()
    assert len(answered) >= 50  # the fuzz reaches the model, not only the validators
