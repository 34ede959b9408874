"""`VLLMEngine` against real HTTP servers speaking vLLM's completions protocol over the tiny model
(`support/vllm_wire_server.py`: vLLM itself cannot run on this machine)."""

from __future__ import annotations

import asyncio
import socket
import time

import openai
import pytest
from support.vllm_wire_server import VLLMWireServer

from harness_gym.engines import (
    ContextLengthExceeded,
    EngineError,
    RequestContext,
    SamplingParams,
    load_engine,
)
from harness_gym.engines.vllm import HashRing, VLLMEngine
from harness_gym.proxy import InterceptionProxy


@pytest.fixture(scope="module")
def tiny():
    engine = load_engine("tiny")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def servers(tiny):
    with VLLMWireServer(tiny) as a, VLLMWireServer(tiny) as b:
        yield a, b


@pytest.fixture
def fresh(servers):
    for server in servers:
        server.served.clear()
        server.unavailable, server.fail_after_tokens, server.policy_version = False, None, None
    return servers


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: connection refused


def prompt(engine, text: str) -> list[int]:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False)


async def collect(engine, ids, key=None, **sampling):
    stream = engine.stream(ids, SamplingParams(**{"max_tokens": 8, "seed": 0, **sampling}),
                           RequestContext(routing_key=key))
    chunks = [chunk async for chunk in stream]
    return stream, chunks


def keys_per_server(engine: VLLMEngine, per_server: int) -> list[str]:
    """Session ids, `per_server` of them owned by each server (ports are random per run)."""
    picked: dict[str, list[str]] = {url: [] for url in engine.urls}
    for i in range(1000):
        key = f"session-{i}"
        owned = picked[engine.server_for(key)]
        if len(owned) < per_server:
            owned.append(key)
    return [key for keys in picked.values() for key in keys]


def test_the_spec_string_builds_the_engine_from_the_servers_model_card(fresh):
    a, b = fresh
    engine = load_engine(f"vllm:{a.url},{b.url}/v1?tokenizer=tiny")
    assert engine.urls == [a.url, b.url]
    assert engine.model_name == "tiny" and engine.max_context == a.max_model_len
    assert engine.stop_token_ids == (engine.tokenizer.convert_tokens_to_ids("<|im_end|>"),)


def test_a_server_without_a_local_model_dir_asks_for_the_tokenizer(fresh):
    with pytest.raises(EngineError, match="tokenizer="):
        load_engine(f"vllm:{fresh[0].url}")


def test_each_session_sticks_to_one_server_and_sessions_spread_over_both(fresh):
    a, b = fresh
    engine = VLLMEngine([a.url, b.url], tokenizer="tiny")
    sessions = keys_per_server(engine, 2)

    async def main():
        for turn in range(2):
            for key in sessions:
                stream, _ = await collect(engine, prompt(engine, f"{key} turn {turn}"), key)
                assert stream.server == engine.server_for(key)
        await engine.aclose()

    asyncio.run(main())
    landed = {key: {server.url for server in (a, b) for r in server.served
                    if f"{key} turn" in engine.tokenizer.decode(r.body["prompt"])}
              for key in sessions}
    assert all(len(urls) == 1 for urls in landed.values())  # both turns on one server
    assert {url for urls in landed.values() for url in urls} == {a.url, b.url}
    assert len(a.served) == len(b.served) == 4


def test_the_hash_ring_spreads_keys_and_moves_few_when_a_server_joins():
    two = HashRing(["http://a", "http://b"])
    three = HashRing(["http://a", "http://b", "http://c"])
    owners = [two.order(f"k{i}")[0] for i in range(2000)]
    assert 0.4 < owners.count(0) / len(owners) < 0.6
    moved = sum(two.order(f"k{i}")[0] != three.order(f"k{i}")[0] for i in range(2000))
    assert moved / 2000 < 0.45  # ~1/3 move to the new server, none between the old ones
    assert all(three.order(f"k{i}")[0] in (two.order(f"k{i}")[0], 2) for i in range(2000))


def test_streamed_token_ids_and_logprobs_are_exactly_what_the_server_sent(fresh):
    a, _ = fresh
    engine = VLLMEngine([a.url], tokenizer="tiny")
    _, chunks = asyncio.run(collect(engine, prompt(engine, "hello"), max_tokens=12))
    assert len(chunks) > 1  # streamed, not one buffered answer
    [served] = a.served
    assert [t for c in chunks for t in c.token_ids] == served.token_ids
    assert [x for c in chunks for x in c.logprobs] == served.logprobs  # bit-exact through JSON
    assert chunks[-1].finish_reason == served.finish_reason == "length"
    body = served.body
    assert body["prompt"] == prompt(engine, "hello")
    assert body["return_token_ids"] is True and body["logprobs"] == 0 and body["stream"] is True
    assert body["top_k"] == -1 and body["seed"] == 0 and body["max_tokens"] == 12
    assert body["skip_special_tokens"] is False and body["include_stop_str_in_output"] is True
    assert set(engine.stop_token_ids) <= set(body["stop_token_ids"])


def test_a_refused_connection_fails_over_to_the_next_server_on_the_ring(fresh):
    a, _ = fresh
    engine = VLLMEngine([dead_url(), a.url], tokenizer="tiny", model_name="tiny",
                        max_context=4096)
    key = next(k for k in (f"s{i}" for i in range(100)) if engine.server_for(k) != a.url)
    stream, chunks = asyncio.run(collect(engine, prompt(engine, "hi"), key))
    assert stream.server == a.url and len(stream.attempts) == 1
    assert "ConnectError" in stream.attempts[0]
    assert [t for c in chunks for t in c.token_ids] == a.served[0].token_ids


def test_an_overloaded_server_is_retried_on_another(fresh):
    a, b = fresh
    a.unavailable = True
    engine = VLLMEngine([a.url, b.url], tokenizer="tiny")
    key = next(k for k in (f"s{i}" for i in range(100)) if engine.server_for(k) == a.url)
    stream, _ = asyncio.run(collect(engine, prompt(engine, "hi"), key))
    assert stream.server == b.url and "HTTP 503" in stream.attempts[0]
    assert [r.status for r in a.served] == [503] and len(b.served) == 1


def test_when_every_server_is_down_the_stream_raises_engine_error_after_backoff():
    engine = VLLMEngine([dead_url(), dead_url()], tokenizer="tiny", model_name="tiny",
                        max_context=4096, max_attempts=5, backoff_s=0.05)
    started = time.perf_counter()
    with pytest.raises(EngineError, match="after 5 attempts"):
        asyncio.run(collect(engine, prompt(engine, "hi")))
    # passes over the ring: 2 + 2 + 1 attempts, with 0.05 s and 0.1 s of backoff between them
    assert time.perf_counter() - started >= 0.15


def test_a_stream_broken_after_tokens_raises_and_is_never_retried(fresh):
    a, b = fresh
    a.fail_after_tokens = 3
    engine = VLLMEngine([a.url, b.url], tokenizer="tiny")
    key = next(k for k in (f"s{i}" for i in range(100)) if engine.server_for(k) == a.url)
    got: list[int] = []

    async def main():
        stream = engine.stream(prompt(engine, "hi"), SamplingParams(max_tokens=10, seed=0),
                               RequestContext(routing_key=key))
        async for chunk in stream:
            got.extend(chunk.token_ids)

    with pytest.raises(EngineError, match="broke"):
        asyncio.run(main())
    assert got == a.served[0].token_ids and len(got) == 3  # no token twice, none invented
    assert not b.served  # nothing was retried


def test_a_prompt_too_long_for_the_server_raises_context_length_exceeded(tiny):
    with VLLMWireServer(tiny, max_model_len=64) as small:
        probed = VLLMEngine([small.url], tokenizer="tiny")
        assert probed.max_context == 64
        with pytest.raises(ContextLengthExceeded):
            probed.stream(list(range(10, 80)), SamplingParams())
        # An engine told a larger context learns it from the server's 400.
        optimistic = VLLMEngine([small.url], tokenizer="tiny", model_name="tiny",
                                max_context=4096)
        with pytest.raises(ContextLengthExceeded) as error:
            asyncio.run(collect(optimistic, list(range(10, 60)), max_tokens=32))
        assert error.value.max_context == 64 and error.value.prompt_tokens == 82


def test_the_servers_policy_version_header_is_exposed_on_the_stream(fresh):
    a, _ = fresh
    engine = VLLMEngine([a.url], tokenizer="tiny")
    engine.policy_version = 3  # the trainer's
    stream, _ = asyncio.run(collect(engine, prompt(engine, "hi")))
    assert stream.policy_version is None
    a.policy_version = 7
    stream, _ = asyncio.run(collect(engine, prompt(engine, "hi")))
    assert stream.policy_version == 7


@pytest.mark.parametrize("stream", [True, False])
def test_the_proxy_records_exactly_the_token_ids_the_vllm_server_sampled(fresh, stream):
    a, b = fresh
    engine = VLLMEngine([a.url, b.url], tokenizer="tiny")
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 16, "seed": 1})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
        answer = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "say hi"}], stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
        else:
            text = answer.choices[0].message.content or ""
        [segment] = session.trace_json()["segments"]
    [served] = a.served + b.served
    assert segment["prompt_ids"] == served.body["prompt"]
    assert segment["response_ids"] == served.token_ids
    assert segment["response_logprobs"] == served.logprobs
    assert text in engine.tokenizer.decode(served.token_ids)


def test_through_the_proxy_every_call_of_a_session_lands_on_one_server(fresh):
    a, b = fresh
    engine = VLLMEngine([a.url, b.url], tokenizer="tiny")
    with InterceptionProxy(engine) as proxy:
        sessions = [proxy.open_session(sampling={"max_tokens": 4}) for _ in range(8)]
        for turn in range(3):
            for index, session in enumerate(sessions):
                client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                       max_retries=0)
                client.chat.completions.create(model="policy", messages=[
                    {"role": "user", "content": f"session {index} turn {turn}"}])
        expected = {s.session_id: engine.server_for(s.session_id) for s in sessions}
    marker_ids = [prompt(engine, f"session {i} turn {t}") for i in range(8) for t in range(3)]
    for server in fresh:
        for served in server.served:
            index = marker_ids.index(served.body["prompt"]) // 3
            assert expected[sessions[index].session_id] == server.url
    assert len(a.served) + len(b.served) == 24
