"""The vLLM 0.33 wire rules of `_vllm_wire.py`, alone (no server): request bodies, chunks, the
error wordings, copied from the vLLM 0.33.0 source they name."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness_gym.engines import ContextLengthExceeded, EngineError, SamplingParams
from harness_gym.engines._vllm_wire import (
    GENERATION_CONFIG_KEYS,
    NEUTRAL_PENALTIES,
    PromptEncoder,
    RetryElsewhere,
    WeightVersionSpan,
    completion_body,
    completion_fields,
    drop_prompt_echo,
    encode_body,
    error_for,
    parse_chunk,
    policy_version_of,
    sse_data,
    stream_error,
)

URL = "http://gpu0:8000"

# The neutral value of every sampling field vLLM 0.33 takes from generation_config.json
# (`ModelConfig.get_diff_sampling_param`), for SamplingParams() defaults.
NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
           "skip_special_tokens": False}


@pytest.mark.parametrize("key", GENERATION_CONFIG_KEYS)
@pytest.mark.parametrize("ids_from", ["logprobs", "echo"])
def test_every_field_a_generation_config_can_set_is_sent_explicitly(key, ids_from):
    body = completion_body("m", [1, 2], SamplingParams(max_tokens=7), [2], ids_from)
    assert key in body, f"{key} left out: vLLM would fill it from generation_config.json"
    if key == "max_tokens":
        assert body[key] == 7
    else:
        assert body[key] == NEUTRAL[key] and type(body[key]) is type(NEUTRAL[key])


def test_the_penalties_are_neutral_whatever_is_sampled():
    body = completion_body("m", [1], SamplingParams(temperature=0.6, top_p=0.9, top_k=20,
                                                     seed=3), [], "logprobs")
    assert {k: body[k] for k in NEUTRAL_PENALTIES} == NEUTRAL_PENALTIES
    assert (body["temperature"], body["top_p"], body["top_k"], body["seed"]) == (0.6, 0.9, 20, 3)


def test_the_two_ways_of_getting_ids_back():
    no_echo = completion_body("m", [1], SamplingParams(), [], "logprobs")
    echo = completion_body("m", [1], SamplingParams(), [], "echo")
    assert no_echo["return_tokens_as_token_ids"] is True and "return_token_ids" not in no_echo
    assert echo["return_token_ids"] is True and "return_tokens_as_token_ids" not in echo
    for body in (no_echo, echo):
        assert body["logprobs"] == 0 and body["return_weight_versions"] is True
        assert body["stream"] is True and body["include_stop_str_in_output"] is True


def _chunk(choice: dict) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": None,
                         "stop_reason": None, "prompt_token_ids": None, "token_ids": None,
                         "weight_versions": None, **choice}], "kv_transfer_params": None}


def test_ids_come_from_the_token_id_placeholders_without_an_echo():
    logprobs = {"text_offset": [0, 12], "token_logprobs": [-0.5, -1.25],
                "tokens": ["token_id:17", "token_id:151645"],
                "top_logprobs": [{"token_id:17": -0.5}, {"token_id:151645": -1.25}]}
    chunk, spans = parse_chunk(_chunk({"logprobs": logprobs, "finish_reason": "stop",
                                       "weight_versions": [{"version": "3", "start": 0,
                                                            "end": 2}]}), "logprobs")
    assert chunk.token_ids == [17, 151645] and chunk.logprobs == [-0.5, -1.25]
    assert chunk.finish_reason == "stop" and spans == [WeightVersionSpan("3", 0, 2)]


def test_a_server_that_ignores_return_tokens_as_token_ids_is_an_error_not_wrong_ids():
    # Text pieces such as "abcdefghi12" must never be read as ids.
    logprobs = {"token_logprobs": [-0.5], "tokens": ["abcdefghi12"], "top_logprobs": [],
                "text_offset": [0]}
    with pytest.raises(EngineError, match="return_tokens_as_token_ids"):
        parse_chunk(_chunk({"logprobs": logprobs}), "logprobs")


def test_echo_mode_reads_token_ids_and_wants_one_logprob_each():
    logprobs = {"token_logprobs": [-0.5], "tokens": ["a"], "top_logprobs": [], "text_offset": [0]}
    chunk, _ = parse_chunk(_chunk({"token_ids": [5], "prompt_token_ids": [1, 2, 3],
                                   "logprobs": logprobs}), "echo")
    assert chunk.token_ids == [5] and chunk.logprobs == [-0.5]
    with pytest.raises(EngineError, match="logprobs"):
        parse_chunk(_chunk({"token_ids": [5, 6], "logprobs": logprobs}), "echo")


_ids = st.lists(st.integers(0, 2**31 - 1), max_size=40)


@settings(deadline=None)  # a loaded machine's pause is not a failure
@given(st.lists(st.tuples(st.booleans(), _ids), min_size=1, max_size=8))
def test_incremental_prompt_json_is_always_the_whole_prompts_json(steps):
    # Each step either extends the session's last prompt or sends an unrelated one (a fork).
    encoder, last = PromptEncoder(max_sessions=2), []
    for extends, ids in steps:
        prompt = last + ids if extends else ids
        as_list, encoded = encoder.encode(prompt, "session")
        assert as_list == prompt and json.loads(encoded) == prompt
        assert encoded == json.dumps(prompt, separators=(",", ":")).encode()
        last = prompt


def test_a_session_forgotten_by_the_encoder_is_encoded_in_full():
    encoder = PromptEncoder(max_sessions=1)
    encoder.encode([1, 2], "a")
    encoder.encode([9], "b")  # pushes "a" out
    assert encoder.encode([1, 2, 3], "a") == ([1, 2, 3], b"[1,2,3]")
    assert encoder.encode([1, 2, 3, 4]) == ([1, 2, 3, 4], b"[1,2,3,4]")  # no key: no cache


def test_the_encoded_body_is_the_completion_body():
    sampling = SamplingParams(max_tokens=7, seed=3)
    fields = completion_fields("m", sampling, [2], "echo")
    body = encode_body(fields, PromptEncoder().encode([5, 6, 7])[1])
    assert json.loads(body) == completion_body("m", [5, 6, 7], sampling, [2], "echo")


@pytest.mark.parametrize("text", ['a \\"prompt_token_ids\\":[1,2] b', '"prompt_token_ids":[1]',
                                  "prompt_token_ids:[3]"])
def test_the_prompt_echo_is_cut_out_and_nothing_else(text):
    chunk = _chunk({"text": text, "prompt_token_ids": list(range(100, 400)), "token_ids": [5]})
    raw = json.dumps(chunk, separators=(",", ":")).encode()
    cut = json.loads(drop_prompt_echo(raw))
    assert cut["choices"][0]["prompt_token_ids"] is None
    chunk["choices"][0]["prompt_token_ids"] = None
    assert cut == chunk  # the text, with whatever it says, is untouched
    later = json.dumps(chunk).encode()  # no echo on later chunks
    assert drop_prompt_echo(later) == later


def test_event_stream_data_lines_are_found_across_any_split():
    stream = b'data: {"a":1}\n\ndata: {"b":[' + b"1," * 5000 + b'2]}\r\n\n: ping\n\ndata: [DONE]'

    async def read(size):
        async def pieces():
            for i in range(0, len(stream), size):
                yield stream[i:i + size]
        return [d async for d in sse_data(pieces())]

    for size in (1, 7, 4096, len(stream)):
        got = asyncio.run(read(size))
        assert got[0] == b'{"a":1}' and got[-1] == b"[DONE]" and len(got) == 3
        assert json.loads(got[1])["b"][-1] == 2


def test_a_usage_chunk_adds_nothing():
    assert parse_chunk({"id": "x", "choices": [], "usage": {"prompt_tokens": 1}}, "echo") is None


@pytest.mark.parametrize("spans, version", [
    (None, None),
    ([WeightVersionSpan("default", 0, 4)], None),  # never labelled: the trainer's label
    ([WeightVersionSpan("7", 0, 4)], 7),
    ([WeightVersionSpan("7", 0, 2), WeightVersionSpan("8", 2, 4)], 7),  # straddled a sync
    ([WeightVersionSpan("default", 0, 2), WeightVersionSpan("8", 2, 4)], 8),
])
def test_the_recorded_version_is_the_oldest_integer_label(spans, version):
    assert policy_version_of(spans) == version


def _error(message: str, param: str | None, code: int = 400) -> str:
    import json

    return json.dumps({"error": {"message": message, "type": "BadRequestError", "param": param,
                                 "code": code}})


# Each wording verbatim from vLLM 0.33.0, with its numbers filled in.
@pytest.mark.parametrize("message, param, prompt, limit", [
    ("This model's maximum context length is 4096 tokens. However, your prompt contains 5000 "
     "input tokens, which exceeds this limit even without any output tokens. Please reduce the "
     "length of the input prompt.", "input_tokens", 5000, 4096),
    ("This model's maximum context length is 4096 tokens. However, your prompt contains at least "
     "4097 input tokens, which exceeds this limit even without any output tokens. Please reduce "
     "the length of the input prompt.", "input_tokens", 4097, 4096),
    ("This model's maximum context length is 4096 tokens. However, your prompt contains 90000 "
     "characters (more than 81920 characters, which is the upper bound for 4096 input tokens). "
     "Please reduce the length of the input prompt.", "input_text", 4321, 4096),
    ("Input length (5000) exceeds model's maximum context length (4096).", None, 5000, 4096),
    ("max_tokens must be at least 1, got 0.", "max_tokens", 4321, 4321),
    ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
     "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages "
     "or completion.", None, 5000, 4096),
])
def test_every_context_wording_becomes_context_length_exceeded(message, param, prompt, limit):
    error = error_for(400, _error(message, param), URL, prompt_tokens=4321)
    assert isinstance(error, ContextLengthExceeded)
    assert (error.prompt_tokens, error.max_context) == (prompt, limit)


def test_max_tokens_above_the_servers_context_names_the_fix():
    error = error_for(400, _error("max_tokens=8192 cannot be greater than max_model_len=4096. "
                                  "Please request fewer output tokens.", "max_tokens"), URL, 10)
    assert isinstance(error, EngineError) and "max_context=4096" in str(error)


def test_an_unknown_model_says_which_names_the_server_has():
    error = error_for(404, _error("The model `qwen` does not exist. Valid aliases: tiny.",
                                  "model", 404), URL, 10)
    assert isinstance(error, EngineError) and "Valid aliases: tiny" in str(error)
    assert "model=" in str(error)


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_errors_are_retried_elsewhere(status):
    body = _error("The server had an error while processing your request.", None, status)
    assert isinstance(error_for(status, body, URL, 10), RetryElsewhere)


def test_other_client_errors_are_final():
    error = error_for(400, _error("temperature must be in [0, 2], got 3.0.", "temperature"),
                      URL, 10)
    assert type(error) is EngineError and "temperature" in str(error)


def test_an_error_event_in_a_200_stream_is_retriable_only_when_it_is_the_servers():
    paused = {"error": {"message": "Generation is paused. Please retry after it resumes.",
                        "type": "ServiceUnavailableError", "param": None, "code": 503}}
    assert isinstance(stream_error(paused, URL), RetryElsewhere)
    bad = {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
    assert type(stream_error(bad, URL)) is EngineError
