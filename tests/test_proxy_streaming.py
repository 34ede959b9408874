"""True streaming: tokens leave as they are sampled, pings cover a slow prefill, and a client
that hangs up stops generation and leaves an incomplete (never corrupt) trace entry."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import openai

from harness_gym.engines import Engine
from harness_gym.proxy import InterceptionProxy, ProxySettings
from support.engines import RecordingEngine

MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


class SlowFirstToken(RecordingEngine):
    """A real engine behind a slow prefill: the first chunk waits `delay_s`. Each call's
    record says whether its stream was closed (`closed`)."""

    def __init__(self, inner: Engine, delay_s: float) -> None:
        super().__init__(inner)
        self.delay_s = delay_s

    async def _stream(self, inner, record):
        record["closed"] = False
        try:
            await asyncio.sleep(self.delay_s)
            async for chunk in super()._stream(inner, record):
                yield chunk
        finally:
            record["closed"] = True


def test_the_first_token_reaches_the_client_long_before_generation_ends(tiny):
    with InterceptionProxy(tiny) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 2500})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
        started = time.perf_counter()
        first_text = None
        # Seed 4 samples no stop token in 2,500 tokens (random weights stop early for most).
        for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                                    seed=4):
            if first_text is None and chunk.choices and chunk.choices[0].delta.content:
                first_text = time.perf_counter() - started
        total = time.perf_counter() - started
    (segment,) = session.trace_json()["segments"]
    assert len(segment["response_ids"]) == 2500
    assert first_text is not None and first_text < total / 3, (first_text, total)


def test_a_client_that_hangs_up_stops_generation_and_leaves_an_incomplete_entry(tiny):
    with InterceptionProxy(tiny) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 3000})
        headers = {"authorization": f"Bearer {session.session_id}"}
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        with httpx.stream("POST", proxy.base_url + "/chat/completions", json=body,
                          headers=headers, timeout=30) as response:
            lines = response.iter_lines()
            seen = [next(lines) for _ in range(12)]
        assert any("content" in line for line in seen)
        deadline = time.monotonic() + 10
        while tiny.active_requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tiny.active_requests == 0  # the engine stopped, well before 3000 tokens
        time.sleep(0.2)
        assert session.calls_in_flight == 0  # the session's call slot came back
        trace = session.trace_json()
        (segment,) = trace["segments"]
        assert segment["role"] == "discarded" and segment["incomplete"]
        assert 0 < len(segment["response_ids"]) < 3000
        assert len(segment["response_logprobs"]) == len(segment["response_ids"])
        assert all(m == 1 for m in segment["loss_mask"])
        assert trace["n_llm_calls"] == 0
        # The session goes on: the next call starts a fresh agent segment.
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert [s["role"] for s in session.trace_json()["segments"]] == ["discarded", "agent"]


def test_a_slow_prefill_is_covered_by_pings_in_every_dialect(tiny):
    engine = SlowFirstToken(tiny, delay_s=1.2)
    settings = ProxySettings(first_token_grace_s=0.05, keepalive_s=0.25)
    with InterceptionProxy(engine, settings=settings) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 4})
        headers = {"authorization": f"Bearer {session.session_id}"}
        anthropic = httpx.post(
            proxy.url + "/v1/messages", headers=headers, timeout=30,
            json={"model": "m", "max_tokens": 4, "messages": MESSAGES, "stream": True})
        events = [line[7:] for line in anthropic.text.splitlines() if line.startswith("event: ")]
        first_block = events.index("content_block_start")
        assert events[0] == "message_start" and events[1:first_block].count("ping") >= 3
        assert events[-1] == "message_stop"
        chat = httpx.post(proxy.base_url + "/chat/completions", headers=headers, timeout=30,
                          json={"model": "m", "messages": MESSAGES, "stream": True})
        assert chat.text.count(": keep-alive") >= 3 and chat.text.endswith("data: [DONE]\n\n")
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
        answer = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True) if c.choices)
        assert isinstance(answer, str)


def test_a_client_that_hangs_up_during_the_prefill_ends_its_call_cleanly(tiny, caplog):
    """The first chunk is awaited by a task of its own. A hang-up before it came once closed
    the engine's stream while that task was still inside it ("aclose(): asynchronous generator
    is already running"): the hang-up was logged as an engine failure."""
    engine = SlowFirstToken(tiny, delay_s=60)
    settings = ProxySettings(first_token_grace_s=0.05, keepalive_s=0.1)
    with InterceptionProxy(engine, settings=settings) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 4})
        headers = {"authorization": f"Bearer {session.session_id}"}
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        for pings in (0, 2):  # hang up before a byte is read, then after two pings
            with httpx.stream("POST", proxy.base_url + "/chat/completions", json=body,
                              headers=headers, timeout=30) as response:
                lines = response.iter_lines()
                while pings:
                    pings -= next(lines) == ": keep-alive"
            deadline = time.monotonic() + 10
            while not (engine.calls[-1]["closed"] and session.calls_in_flight == 0):
                assert time.monotonic() < deadline, (engine.calls[-1], session.calls_in_flight)
                time.sleep(0.05)
        assert len(engine.calls) == 2 and all(c["token_ids"] == [] for c in engine.calls)
    assert not [r for r in caplog.records if "stream aborted" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_body_over_the_limit_gets_413_and_a_runaway_session_429_in_each_dialect(tiny):
    engine = SlowFirstToken(tiny, delay_s=1.5)
    settings = ProxySettings(max_body_bytes=2000, max_calls_in_flight_per_session=1)
    with InterceptionProxy(engine, settings=settings) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 2})
        headers = {"authorization": f"Bearer {session.session_id}"}
        big = [{"role": "user", "content": "x" * 3000}]
        chat = httpx.post(proxy.base_url + "/chat/completions", headers=headers,
                          json={"model": "m", "messages": big})
        assert chat.status_code == 413
        assert chat.json()["error"]["code"] == "request_too_large"
        messages = httpx.post(proxy.url + "/v1/messages", headers=headers,
                              json={"model": "m", "max_tokens": 2, "messages": big})
        assert messages.status_code == 413
        assert messages.json()["error"]["type"] == "request_too_large"

        import threading
        slow = threading.Thread(target=httpx.post, args=(proxy.base_url + "/chat/completions",),
                                kwargs={"headers": headers, "timeout": 30,
                                        "json": {"model": "m", "messages": MESSAGES}})
        slow.start()
        time.sleep(0.5)  # the first call holds the session's only slot
        second = httpx.post(proxy.url + "/v1/messages", headers=headers,
                            json={"model": "m", "max_tokens": 2, "messages": MESSAGES})
        assert second.status_code == 429
        assert second.json()["error"]["type"] == "rate_limit_error"
        slow.join()
        again = httpx.post(proxy.base_url + "/chat/completions", headers=headers, timeout=30,
                           json={"model": "m", "messages": MESSAGES})
        assert again.status_code == 200  # the slot came back
        assert session.trace_json()["n_llm_calls"] == 2
