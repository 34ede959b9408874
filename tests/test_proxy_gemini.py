"""The Gemini API surface of the proxy, driven by the official `google-genai` SDK over HTTP.

Conversations are echoed back as Gemini CLI does: the streamed answer's text parts merged into
one, its thought parts dropped, our call ids rewritten (`NAME__ID`), a made-up thought signature
on the first call, then the results as `functionResponse` parts of a user turn.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.engines import RecordingEngine, tool_call_script
from test_proxy_anthropic import ANY_JSON, BrokenEngine
from test_proxy_openai_chat import assert_segment_is_what_the_engine_sampled

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy

genai = pytest.importorskip("google.genai", reason="the test extra's google-genai is absent")
from google.genai import errors, types  # noqa: E402

SHELL = types.FunctionDeclaration(
    name="bash", description="Run a shell command.",
    parameters_json_schema={"type": "object", "properties": {"command": {"type": "string"}}})
SYSTEM = "You are a careful coding agent."


def root(proxy: InterceptionProxy) -> str:
    """The server root: Google's SDK adds `/v1beta/...` itself."""
    return proxy.base_url.removesuffix("/v1")


def client_for(proxy: InterceptionProxy, key: str) -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=root(proxy), retry_options=types.HttpRetryOptions(attempts=1)))


def open_client(proxy: InterceptionProxy, **sampling):
    session = proxy.open_session(sampling=sampling or None)
    return session, client_for(proxy, session.session_id)


def config(**kw) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        system_instruction=SYSTEM, tools=[types.Tool(function_declarations=[SHELL])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True), **kw)


def ask(client, contents, stream: bool, **kw) -> list[dict]:
    """One call; returns the answer's parts as Gemini CLI keeps them in its history."""
    if not stream:
        response = client.models.generate_content(model="policy", contents=contents,
                                                  config=config(**kw))
        assert response.candidates[0].finish_reason in ("STOP", "MAX_TOKENS")
        return [p.model_dump(exclude_none=True) for p in response.candidates[0].content.parts]
    chunks = list(client.models.generate_content_stream(model="policy", contents=contents,
                                                        config=config(**kw)))
    assert chunks[-1].candidates[0].finish_reason in ("STOP", "MAX_TOKENS")
    assert chunks[-1].usage_metadata.total_token_count > 0
    parts: list[dict] = []
    for chunk in chunks:
        for part in chunk.candidates[0].content.parts or []:
            part = part.model_dump(exclude_none=True)
            if parts and set(part) == {"text"} == set(parts[-1]):
                parts[-1]["text"] += part["text"]  # the CLI merges a stream's text parts
            else:
                parts.append(part)
    return parts


def echo(parts: list[dict]) -> dict:
    out = []
    for part in parts:
        if "function_call" in part:
            call = part["function_call"]
            stamp = {} if any("function_call" in p for p in out) else {
                "thought_signature": b"skip_thought_signature_validator"}  # what the CLI adds
            out.append({"function_call": {**call, "id": f"{call['name']}__{call['id']}"},
                        **stamp})
        elif not part.get("thought"):
            out.append(part)
    return {"role": "model", "parts": out}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_five_turn_tool_conversation_is_one_segment_of_the_engines_exact_tokens(tiny, stream):
    engine = RecordingEngine(ScriptedEngine(tiny, tool_call_script(turns=5)))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        contents: list = [{"role": "user", "parts": [{"text": "Fix the bug."}]}]
        for turn in range(5):
            parts = ask(client, contents, stream)
            calls = [p["function_call"] for p in parts if "function_call" in p]
            if turn < 4:
                assert [c["name"] for c in calls] == ["bash"]
                assert calls[0]["args"] == {"command": f"echo step{turn} > out{turn}.txt"}
                contents.append(echo(parts))
                response = {"name": "bash", "response": {"output": f"ok {turn}"}}
                if turn % 2:  # without an id: it answers the call of that name
                    response["id"] = f"bash__{calls[0]['id']}"
                contents.append({"role": "user", "parts": [{"function_response": response}]})
            else:
                assert not calls and parts[0]["text"] == "All done."
        trace = session.trace_json()
    assert [s["role"] for s in trace["segments"]] == ["agent"]
    assert trace["n_llm_calls"] == 5 and trace["n_tool_calls"] == 4
    assert_segment_is_what_the_engine_sampled(trace["segments"][0], engine.calls, tiny)


def test_the_stream_is_sent_as_sampled_not_buffered(tiny):
    """Each chunk carries one delta: more than one text chunk arrives before the end."""
    engine = ScriptedEngine(tiny, lambda prompt: "one two three four five six seven")
    with InterceptionProxy(engine) as proxy:
        _, client = open_client(proxy)
        chunks = list(client.models.generate_content_stream(model="policy", contents="hi"))
    texts = [c.text for c in chunks if c.text]
    assert len(texts) > 2 and "".join(texts) == "one two three four five six seven"
    assert [c.candidates[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)


def test_streamed_and_plain_answers_with_the_same_seed_carry_the_same_tokens(tiny):
    with InterceptionProxy(tiny) as proxy:
        traces, answers = [], []
        for stream in (False, True):
            session, client = open_client(proxy)
            answers.append(ask(client, "hi", stream, seed=7, max_output_tokens=16,
                               temperature=1.0))
            traces.append(session.trace_json()["segments"][0])
    assert traces[0]["response_ids"] == traces[1]["response_ids"]
    assert answers[0] == answers[1]


def test_generation_config_reaches_the_engine(tiny):
    engine = RecordingEngine(ScriptedEngine(tiny, lambda prompt: "alpha beta STOP gamma"))
    with InterceptionProxy(engine) as proxy:
        _, client = open_client(proxy)
        response = client.models.generate_content(
            model="policy", contents="hi", config=types.GenerateContentConfig(
                temperature=0.5, top_p=0.9, top_k=20, max_output_tokens=40,
                stop_sequences=["STOP"]))
    assert response.text.strip() == "alpha beta"  # ended at the stop string
    sampling = engine.calls[0]["sampling"]
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.5, 0.9, 20)
    assert sampling.max_tokens == 40


def test_max_output_tokens_ends_with_max_tokens(tiny):
    with InterceptionProxy(tiny) as proxy:
        _, client = open_client(proxy)
        response = client.models.generate_content(
            model="policy", contents="hi",
            config=types.GenerateContentConfig(max_output_tokens=3))
    assert response.candidates[0].finish_reason == "MAX_TOKENS"
    assert response.usage_metadata.candidates_token_count == 3


def test_count_tokens_is_the_prompt_the_bridge_builds(tiny):
    engine = RecordingEngine(ScriptedEngine(tiny, lambda prompt: "ok"))
    with InterceptionProxy(engine) as proxy:
        session, client = open_client(proxy)
        counted = client.models.count_tokens(model="policy", contents="count me, please")
        client.models.generate_content(model="policy", contents="count me, please")
        assert len(session.trace.calls) == 1  # counting recorded nothing
    assert counted.total_tokens == len(engine.calls[0]["prompt_ids"])


def test_the_key_is_taken_from_the_query_string_too(tiny):
    with InterceptionProxy(ScriptedEngine(tiny, lambda prompt: "ok")) as proxy:
        session = proxy.open_session()
        url = f"{root(proxy)}/v1beta/models/policy:generateContent?key={session.session_id}"
        response = httpx.post(url, json={"contents": [{"parts": [{"text": "hi"}]}]})
    assert response.status_code == 200, response.text
    assert response.json()["candidates"][0]["content"]["parts"] == [{"text": "ok"}]


# --- errors: each in Google's shape, none leaves a trace entry ----------------------------


@pytest.fixture(scope="module")
def small_context_proxy(tiny):
    engine = ScriptedEngine(tiny, lambda prompt: "ok")
    engine.max_context = 200
    with InterceptionProxy(engine) as proxy:
        yield proxy


def post(proxy, body, key, method="generateContent"):
    headers = {"x-goog-api-key": key, "content-type": "application/json"}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{root(proxy)}/v1beta/models/policy:{method}", content=content,
                      headers=headers)


def assert_google_error(response, code: int, status: str) -> str:
    assert response.status_code == code, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "status"}
    assert (error["code"], error["status"]) == (code, status) and error["message"]
    return error["message"]


GOOD = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


@pytest.mark.parametrize(
    "body, where",
    [
        (b"{not json", "JSON"),
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "wizard", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ({"contents": [{"role": "user"}]}, "contents[0].parts"),
        ({"contents": [{"parts": [{"executableCode": {}}]}]}, "contents[0].parts[0]"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
         "contents[0].parts[0].functionCall.name"),
        ({**GOOD, "generationConfig": {"maxOutputTokens": 0}}, "maxOutputTokens"),
        ({**GOOD, "generationConfig": {"temperature": "hot"}}, "temperature"),
        ({**GOOD, "generationConfig": {"candidateCount": 2}}, "candidateCount"),
        ({**GOOD, "tools": [{"functionDeclarations": [{"description": "x"}]}]},
         "functionDeclarations[0].name"),
        ({**GOOD, "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}, "mode"),
    ],
)
def test_a_bad_request_gets_a_400_in_googles_shape_and_no_trace_entry(
    small_context_proxy, body, where
):
    session = small_context_proxy.open_session()
    message = assert_google_error(post(small_context_proxy, body, session.session_id), 400,
                                  "INVALID_ARGUMENT")
    assert where in message
    assert session.trace.calls == []


def test_unknown_methods_keys_and_non_sse_streams_get_googles_shape(small_context_proxy):
    session = small_context_proxy.open_session()
    assert_google_error(post(small_context_proxy, GOOD, session.session_id, "embedContent"),
                        404, "NOT_FOUND")
    assert_google_error(post(small_context_proxy, GOOD, "nope"), 401, "UNAUTHENTICATED")
    assert_google_error(post(small_context_proxy, GOOD, session.session_id,
                             "streamGenerateContent"), 400, "INVALID_ARGUMENT")
    client = client_for(small_context_proxy, "nope")  # kept: a dropped Client closes itself
    with pytest.raises(errors.ClientError) as caught:
        client.models.generate_content(model="m", contents="hi")
    assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"


def test_google_search_and_unknown_fields_are_tolerated(small_context_proxy):
    session = small_context_proxy.open_session()
    body = {**GOOD, "tools": [{"googleSearch": {}}, {"functionDeclarations": [
        {"name": "bash", "parameters": {"type": "OBJECT"}}]}],
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}, "responseMimeType": "x"},
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}}, "cachedContent": None}
    response = post(small_context_proxy, body, session.session_id)
    assert response.status_code == 200, response.text
    assert response.json()["candidates"][0]["content"]["parts"] == [{"text": "ok"}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_gets_geminis_token_count_error(
    small_context_proxy, stream
):
    session, client = open_client(small_context_proxy)
    call = client.models.generate_content_stream if stream else client.models.generate_content
    with pytest.raises(errors.ClientError, match=r"input token count \(\d+\) exceeds the "
                       r"maximum number of tokens allowed \(200\)") as caught:
        result = call(model="m", contents="word " * 400)
        list(result) if stream else None
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    assert session.trace.calls == []


def test_an_engine_that_is_down_or_dies_mid_stream_gets_unavailable(tiny):
    with InterceptionProxy(BrokenEngine(tiny, None)) as proxy:
        _, client = open_client(proxy)
        with pytest.raises(errors.ServerError) as caught:
            client.models.generate_content(model="m", contents="hi")
        assert caught.value.code == 503 and caught.value.status == "UNAVAILABLE"
    with InterceptionProxy(BrokenEngine(tiny, 3)) as proxy:
        session, client = open_client(proxy, max_tokens=10)
        with pytest.raises(errors.APIError) as caught:
            list(client.models.generate_content_stream(model="m", contents="hi"))
        assert caught.value.code == 503
        assert {c.kind for c in session.trace.calls} == {"aborted"}


# --- fuzz: every body gets a shaped 4xx or a valid answer, never a 5xx --------------------

_part = st.one_of(
    st.fixed_dictionaries({"text": st.text(max_size=10) | ANY_JSON},
                          optional={"thought": st.booleans() | ANY_JSON,
                                    "thoughtSignature": st.text(max_size=4) | ANY_JSON}),
    st.fixed_dictionaries({"functionCall": st.fixed_dictionaries(
        {"name": st.sampled_from(["bash", "x"]) | ANY_JSON},
        optional={"args": ANY_JSON, "id": st.text(max_size=4) | ANY_JSON}) | ANY_JSON}),
    st.fixed_dictionaries({"functionResponse": st.fixed_dictionaries(
        {"name": st.sampled_from(["bash", "x"]) | ANY_JSON},
        optional={"response": ANY_JSON, "id": st.text(max_size=4) | ANY_JSON}) | ANY_JSON}),
    st.fixed_dictionaries({"inlineData": st.fixed_dictionaries(
        {"mimeType": st.sampled_from(["image/png", "application/pdf"]) | ANY_JSON,
         "data": st.text(max_size=8) | ANY_JSON}) | ANY_JSON}),
    ANY_JSON,
)
_content = st.fixed_dictionaries(
    {"parts": st.lists(_part, max_size=3) | ANY_JSON},
    optional={"role": st.sampled_from(["user", "model", "function", "x"]) | ANY_JSON},
) | ANY_JSON
_decl = st.fixed_dictionaries(
    {"name": st.sampled_from(["bash", "x"]) | ANY_JSON},
    optional={"parameters": ANY_JSON, "parametersJsonSchema": ANY_JSON,
              "description": ANY_JSON})
_body = st.fixed_dictionaries(
    {"contents": st.lists(_content, min_size=1, max_size=4) | ANY_JSON},
    optional={
        "systemInstruction": st.fixed_dictionaries({"parts": st.lists(_part, max_size=2)})
        | ANY_JSON,
        "generationConfig": st.fixed_dictionaries({}, optional={
            "temperature": st.floats(-1, 3) | ANY_JSON, "topP": ANY_JSON, "topK": ANY_JSON,
            "maxOutputTokens": st.integers(-1, 8) | ANY_JSON, "stopSequences": ANY_JSON,
            "candidateCount": ANY_JSON, "seed": ANY_JSON}) | ANY_JSON,
        "tools": st.lists(st.fixed_dictionaries({"functionDeclarations": st.lists(
            _decl, max_size=2) | ANY_JSON}) | ANY_JSON, max_size=2) | ANY_JSON,
        "toolConfig": st.fixed_dictionaries({"functionCallingConfig": st.fixed_dictionaries(
            {}, optional={"mode": st.sampled_from(["AUTO", "ANY", "NONE", "x"]) | ANY_JSON,
                          "allowedFunctionNames": ANY_JSON}) | ANY_JSON}) | ANY_JSON,
    },
)


def test_fuzzed_bodies_get_a_shaped_4xx_or_a_valid_answer(tiny):
    engine = ScriptedEngine(tiny, lambda prompt: "ok")
    answered = []
    with InterceptionProxy(engine) as proxy, httpx.Client(base_url=root(proxy)) as http:
        session = proxy.open_session(sampling={"max_tokens": 2})
        headers = {"x-goog-api-key": session.session_id}

        @settings(max_examples=600, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(body=_body, method=st.sampled_from(
            ["generateContent", "streamGenerateContent?alt=sse", "countTokens"]))
        def check(body, method):
            response = http.post(f"/v1beta/models/policy:{method}", json=body, headers=headers)
            assert response.status_code in (200, 400), response.text
            if response.status_code == 400:
                assert_google_error(response, 400, "INVALID_ARGUMENT")
                return
            answered.append(body)
            if method.startswith("stream"):
                assert response.text.startswith("data: {")
                assert '"finishReason":"STOP"' in response.text or "MAX_TOKENS" in response.text
            elif method == "countTokens":
                assert response.json()["totalTokens"] > 0
            else:
                assert response.json()["candidates"][0]["content"]["role"] == "model"

        check()
    assert len(answered) >= 10  # the fuzz reaches the model, not only the validators
