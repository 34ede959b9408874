"""Fuzz the OpenAI Chat route (`/v1/chat/completions`) with >= 1000 request bodies.

The same contract as the Anthropic Messages and Responses fuzz tests (and the same JSON
strategy): every body gets a 400 in OpenAI's error shape or a valid answer (JSON or SSE), never
a 500 or a hang. A fifth of the bodies are well-formed, so the fuzz reaches the model too.
"""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_proxy_anthropic import ANY_JSON

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


_part = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "input_text", "output_text", "image_url", "x"]),
         "text": st.text(max_size=10) | ANY_JSON}
    ),
    st.fixed_dictionaries({}, optional={"text": st.text(max_size=5) | ANY_JSON}),
    st.text(max_size=5),
    ANY_JSON,
)
_content = st.none() | st.text(max_size=20) | st.lists(_part, max_size=3) | ANY_JSON
_tool_call = st.one_of(
    st.fixed_dictionaries(
        {"id": st.text(max_size=5) | ANY_JSON, "type": st.just("function") | ANY_JSON,
         "function": st.fixed_dictionaries(
             {"name": st.sampled_from(["bash", "x", ""]) | ANY_JSON},
             optional={"arguments": st.sampled_from(["{}", '{"command": "ls"}', "{bad", "", " ",
                                                     "[1]", "null"])
                       | st.dictionaries(st.text(max_size=4), ANY_JSON, max_size=2)
                       | ANY_JSON},
         ) | ANY_JSON}
    ),
    ANY_JSON,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])
     | ANY_JSON,
     "content": _content},
    optional={"tool_calls": st.lists(_tool_call, max_size=2) | ANY_JSON,
              "tool_call_id": st.text(max_size=5) | ANY_JSON,
              "name": st.text(max_size=5) | ANY_JSON,
              "reasoning_content": ANY_JSON},
)
_tool = st.one_of(
    st.just(BASH),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "custom"]) | ANY_JSON,
         "function": st.fixed_dictionaries(
             {"name": st.text(max_size=5) | ANY_JSON},
             optional={"description": st.text(max_size=5) | ANY_JSON,
                       "parameters": st.dictionaries(st.text(max_size=4), ANY_JSON, max_size=2)
                       | ANY_JSON}) | ANY_JSON}
    ),
    ANY_JSON,
)
_wild_body = st.fixed_dictionaries(
    {"messages": st.lists(_message, max_size=4) | ANY_JSON},
    optional={
        "model": st.text(max_size=5) | ANY_JSON,
        "max_tokens": st.integers(-1, 8) | ANY_JSON,
        "max_completion_tokens": st.integers(-1, 8) | ANY_JSON,
        "stream": st.booleans() | ANY_JSON,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()
                                                              | ANY_JSON}) | ANY_JSON,
        "temperature": st.floats(-1, 3) | ANY_JSON,
        "top_p": st.floats(-0.5, 1.5) | ANY_JSON,
        "top_k": st.integers(-2, 5) | ANY_JSON,
        "seed": st.integers(-5, 2**40) | ANY_JSON,
        "n": st.integers(0, 3) | ANY_JSON,
        "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3) | ANY_JSON,
        "tools": st.lists(_tool, max_size=2) | ANY_JSON,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | ANY_JSON,
        "parallel_tool_calls": ANY_JSON,
        "user": ANY_JSON,
        "metadata": ANY_JSON,
        "response_format": ANY_JSON,
    },
)
_valid_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user"]),
                           "content": st.text(max_size=20)
                           | st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                             "text": st.text(max_size=8)}),
                                      max_size=2)}),
    st.fixed_dictionaries({"role": st.just("assistant"),
                           "content": st.none() | st.text(max_size=20)},
                          optional={"tool_calls": st.lists(st.fixed_dictionaries(
                              {"id": st.text(max_size=5), "type": st.just("function"),
                               "function": st.fixed_dictionaries(
                                   {"name": st.just("bash"),
                                    "arguments": st.sampled_from(['{"command":"ls"}', "{}"])})}),
                              max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.text(max_size=5),
                           "content": st.text(max_size=20)}),
)
_valid_body = st.fixed_dictionaries(
    {"messages": st.lists(_valid_message, min_size=1, max_size=4)},
    optional={"model": st.text(max_size=5), "max_tokens": st.integers(1, 8),
              "stream": st.booleans(),
              "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
              "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
              "seed": st.integers(0, 2**31), "stop": st.lists(st.text(min_size=1, max_size=3),
                                                             max_size=2),
              "tools": st.lists(st.just(BASH), max_size=1),
              "tool_choice": st.just("auto"), "metadata": ANY_JSON},
)
_body = st.one_of(_valid_body, *[_wild_body] * 4)  # a fifth are well-formed


def test_fuzzed_bodies_get_a_shaped_400_or_a_valid_answer(tiny):
    engine = ScriptedEngine(tiny, lambda prompt: "ok")
    answered = []
    with InterceptionProxy(engine) as proxy, httpx.Client(base_url=proxy.url,
                                                          timeout=30) as http:
        session = proxy.open_session(sampling={"max_tokens": 2})
        headers = {"authorization": f"Bearer {session.session_id}"}

        @settings(max_examples=1000, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(body=_body)
        def check(body):
            response = http.post("/v1/chat/completions", json=body, headers=headers)
            assert response.status_code in (200, 400), response.text
            if response.status_code == 400:
                error = response.json()["error"]
                assert error["type"] == "invalid_request_error"
                assert isinstance(error["message"], str) and error["message"]
                assert "param" in error and "code" in error
                return
            answered.append(body)
            if body.get("stream") is True:
                assert response.headers["content-type"].startswith("text/event-stream")
                assert response.text.startswith("data: {")
                assert response.text.rstrip().endswith("data: [DONE]")
                assert '"error"' not in response.text, response.text
            else:
                answer = response.json()
                assert answer["object"] == "chat.completion"
                (choice,) = answer["choices"]
                assert choice["message"]["role"] == "assistant"
                assert choice["finish_reason"] in ("stop", "length", "tool_calls")
                assert answer["usage"]["prompt_tokens"] > 0

        check()
    assert len(answered) >= 50  # the fuzz reaches the model, not only the validators
