"""A prompt too long for the vLLM server reaches each client as its own dialect's
context-too-long error (the one that makes a CLI compact), from vLLM 0.33's own wording.

The engine is told a larger context than the server has, so the proxy's local check lets the
prompt through and the server's 400 ("...However, your prompt contains M input tokens, which
exceeds this limit even without any output tokens...", `support/vllm_wire_server.py`, a
wire-protocol fake of vLLM) is what gets translated."""

from __future__ import annotations

import anthropic
import openai
import pytest
from support.vllm_wire_server import VLLMWireServer

from harness_gym.engines import load_engine
from harness_gym.engines.vllm import VLLMEngine
from harness_gym.proxy import InterceptionProxy

LIMIT = 256
LONG = "lorem ipsum dolor " * 200


@pytest.fixture(scope="module")
def proxy():
    tiny = load_engine("tiny")
    with VLLMWireServer(tiny, max_model_len=LIMIT, logprobs_mode="processed_logprobs") as server:
        engine = VLLMEngine([server.url], tokenizer="tiny", model_name="tiny", max_context=4096)
        with InterceptionProxy(engine) as running:
            running.server = server
            yield running
        engine.close()
    tiny.close()


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_client_gets_400_context_length_exceeded(proxy, stream):
    session = proxy.open_session(sampling={"max_tokens": 16})
    client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
    with pytest.raises(openai.BadRequestError) as error:
        answer = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": LONG}], stream=stream)
        list(answer) if stream else None
    assert error.value.status_code == 400 and error.value.code == "context_length_exceeded"
    assert f"maximum context length is {LIMIT} tokens" in error.value.message
    served = proxy.server.served[-1]
    assert served.status == 400 and "even without any output tokens" in served.error
    assert session.trace_json()["n_llm_calls"] == 0  # nothing sampled, nothing recorded


def test_an_anthropic_client_gets_prompt_is_too_long(proxy):
    session = proxy.open_session(sampling={"max_tokens": 16})
    client = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id,
                                 max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as error:  # Claude Code always streams
        with client.messages.stream(model="policy", max_tokens=16,
                                    messages=[{"role": "user", "content": LONG}]) as stream:
            stream.get_final_message()
    body = error.value.body["error"]
    assert error.value.status_code == 400 and body["type"] == "invalid_request_error"
    # The text Claude Code matches to compact its history.
    assert body["message"].startswith("prompt is too long: ")
    assert body["message"].endswith(f" tokens > {LIMIT} maximum")
