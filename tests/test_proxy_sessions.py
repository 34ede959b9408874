"""The proxy is closed to agents (DESIGN invariants 3 and 8, issue 11 items 4 and 5).

A session key reaches only its own session's model routes: it can neither open, read nor close
any session, its own included. Sessions expire when idle and their number is capped, each with
an error that says what happened. A session that ends while its CLI still calls (the env closed
it) answers that call with an error and records nothing more; nothing raises out of the proxy.
Driven over real HTTP with the official SDKs.
"""

from __future__ import annotations

import asyncio
import threading
import time

import anthropic
import httpx
import openai
import pytest

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy, ProxyError, ProxySettings
from support.engines import RecordingEngine
from support.server_log import server_errors as errors_logged_by_the_server

HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def server_errors():
    with errors_logged_by_the_server() as records:
        yield records


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_the_proxy_always_has_an_admin_key_and_its_routes_need_it(tiny):
    with InterceptionProxy(tiny) as proxy, InterceptionProxy(tiny) as other:
        assert proxy.admin_key and proxy.admin_key != other.admin_key  # random, per proxy
        refused = httpx.post(proxy.url + "/sessions", json={})
        assert refused.status_code == 401
        assert "admin key" in refused.json()["error"]["message"]
        created = httpx.post(proxy.url + "/sessions", json={}, headers=bearer(proxy.admin_key))
        assert created.status_code == 201
        assert httpx.get(proxy.url + "/health").json() == {"status": "ok",
                                                           "model": tiny.model_name}


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_a_session_key_cannot_create_read_or_delete_any_session(tiny, header):
    with InterceptionProxy(tiny) as proxy:
        mine, theirs = proxy.open_session(), proxy.open_session()
        key = mine.session_id
        headers = {header: f"Bearer {key}" if header == "authorization" else key}
        attempts = [
            httpx.post(proxy.url + "/sessions", json={}, headers=headers),
            httpx.get(f"{proxy.url}/sessions/{key}/trace", headers=headers),
            httpx.get(f"{proxy.url}/sessions/{theirs.session_id}/trace", headers=headers),
            httpx.delete(f"{proxy.url}/sessions/{key}", headers=headers),
            httpx.delete(f"{proxy.url}/sessions/{theirs.session_id}", headers=headers),
        ]
        for response in attempts:
            assert response.status_code == 403, response.text
            assert "session key cannot use the admin routes" in response.json()["error"]["message"]
        assert "sessions" not in httpx.get(proxy.url + "/health", headers=headers).json()
        assert len(proxy.sessions) == 2 and not mine.closed and not theirs.closed
        # ... and the session still works for what it is for.
        client = openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)
        assert client.chat.completions.create(model="m", messages=HELLO, max_tokens=2).choices


def test_an_open_admin_proxy_serves_sessions_to_local_clients_but_never_to_session_keys(tiny):
    """`harness-gym serve` with no key on loopback: the standalone contract's optional admin key
    (benchmarks and scripts POST /sessions bare), still closed to every session key."""
    with InterceptionProxy(tiny, open_admin=True) as proxy:
        assert proxy.admin_key is None
        created = httpx.post(proxy.url + "/sessions", json={})
        assert created.status_code == 201
        key = created.json()["api_key"]
        assert httpx.get(f"{proxy.url}/sessions/{key}/trace").status_code == 200
        for response in (httpx.post(proxy.url + "/sessions", json={}, headers=bearer(key)),
                         httpx.delete(f"{proxy.url}/sessions/{key}", headers=bearer(key))):
            assert response.status_code == 403, response.text
        assert httpx.delete(f"{proxy.url}/sessions/{key}").status_code == 200


@pytest.mark.parametrize("options", [{"host": "0.0.0.0"}, {"admin_key": "k"}])
def test_open_admin_is_refused_off_loopback_or_beside_a_key(tiny, options):
    with pytest.raises(ValueError, match="open_admin"):
        InterceptionProxy(tiny, open_admin=True, **options)


def test_an_admin_key_is_not_a_session_key(tiny):
    with InterceptionProxy(tiny, admin_key="admin-secret") as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key="admin-secret", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="m", messages=HELLO)


def test_an_idle_session_expires_with_a_401_that_says_so(tiny):
    settings = ProxySettings(session_idle_timeout_s=2.0)
    with InterceptionProxy(tiny, settings=settings) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 2})
        chat = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id, max_retries=0)
        messages = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id,
                                       max_retries=0)
        for _ in range(3):  # calls keep it alive past the idle timeout
            chat.chat.completions.create(model="m", messages=HELLO)
            time.sleep(0.9)
        time.sleep(1.5)
        with pytest.raises(openai.AuthenticationError, match="expired.*session_idle_timeout_s"):
            chat.chat.completions.create(model="m", messages=HELLO)
        with pytest.raises(anthropic.AuthenticationError, match="expired"):
            messages.messages.create(model="m", max_tokens=2, messages=HELLO)
        assert session.closed and len(proxy.sessions) == 0
        assert proxy.close_session(session.session_id) is None  # the env's close: no error
        assert len(session.trace_json()["segments"]) == 3  # what it did is still there


def test_the_session_cap_refuses_one_more_with_a_clear_429(tiny):
    settings = ProxySettings(max_sessions=2, session_idle_timeout_s=0.5)
    with InterceptionProxy(tiny, settings=settings) as proxy:
        admin = bearer(proxy.admin_key)
        first = httpx.post(proxy.url + "/sessions", json={}, headers=admin).json()["session_id"]
        proxy.open_session()
        refused = httpx.post(proxy.url + "/sessions", json={}, headers=admin)
        assert refused.status_code == 429
        assert "max_sessions=2" in refused.json()["error"]["message"]
        with pytest.raises(ProxyError, match="Too many open sessions"):
            proxy.open_session()
        assert httpx.delete(f"{proxy.url}/sessions/{first}", headers=admin).status_code == 200
        proxy.open_session()  # a closed session frees its place
        time.sleep(0.7)
        proxy.open_session()  # and so do expired ones
        proxy.open_session()
        assert len(proxy.sessions) == 2


def test_a_session_closed_while_its_cli_streams_ends_the_call_and_records_nothing(
    tiny, server_errors
):
    with InterceptionProxy(tiny) as proxy:
        session = proxy.open_session(sampling={"max_tokens": 3000})
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                               max_retries=0)
        seen = 0
        with pytest.raises(openai.APIError, match="closed while the call ran"):
            # Seed 4 samples no stop token in 3,000 tokens (test_proxy_streaming).
            for chunk in client.chat.completions.create(model="m", messages=HELLO, stream=True,
                                                        seed=4):
                seen += 1
                if seen == 5:
                    final = proxy.close_session(session.session_id)
                    assert final is session
                    at_close = session.trace_json()
        assert session.trace_json() == at_close  # the trace the env took at close is final
        assert at_close["segments"] == [] and at_close["n_llm_calls"] == 0
        deadline = time.monotonic() + 10
        while tiny.active_requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tiny.active_requests == 0  # the engine stopped generating for it
        with pytest.raises(openai.AuthenticationError, match="closed"):
            client.chat.completions.create(model="m", messages=HELLO)
    assert server_errors == []


class PacedEngine(RecordingEngine):
    """A real engine whose tokens come 5 ms apart; `streaming` is set once the first is out and
    `open_streams` counts streams the proxy has not closed yet."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.streaming = threading.Event()
        self.open_streams = 0

    async def _stream(self, inner, record):
        self.open_streams += 1
        try:
            async for chunk in super()._stream(inner, record):
                self.streaming.set()
                yield chunk
                await asyncio.sleep(0.005)
        finally:
            self.open_streams -= 1


def test_a_session_closed_during_a_plain_call_answers_it_with_a_401(tiny, server_errors):
    engine = PacedEngine(ScriptedEngine(tiny, lambda prompt: "word " * 400))
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session()
        client = anthropic.Anthropic(base_url=proxy.url, api_key=session.session_id,
                                     max_retries=0)

        def close_once_sampling() -> None:
            engine.streaming.wait(30)
            proxy.close_session(session.session_id)

        closer = threading.Thread(target=close_once_sampling)
        closer.start()
        with pytest.raises(anthropic.AuthenticationError, match="closed while the call ran"):
            client.messages.create(model="m", max_tokens=1000, messages=HELLO)
        closer.join()
        assert session.trace_json()["segments"] == []
        assert engine.open_streams == 0
    assert server_errors == []
