"""Each call's sampling (temperature, top-p, top-k, max_tokens, seed) lands in its segment, one
entry per call, with the response offset where the call's tokens start: what a trainer needs to
re-score a call under the distribution that drew it. Real proxy, real HTTP, the official openai
SDK, the tiny model sampling.
"""

from __future__ import annotations

import openai
import pytest

from harness_gym.engines import load_engine
from harness_gym.proxy import InterceptionProxy


@pytest.fixture(scope="module")
def proxy():
    engine = load_engine("tiny")
    proxy = InterceptionProxy(engine).start()
    yield proxy
    proxy.stop()
    engine.close()


def client_for(proxy: InterceptionProxy, **sampling):
    session = proxy.open_session(sampling=sampling or None)
    return session, openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                  max_retries=0)


def ask(client, messages, stream: bool = False, **kw) -> dict:
    answer = client.chat.completions.create(model="policy", messages=messages, stream=stream, **kw)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    else:
        text = answer.choices[0].message.content or ""
    return {"role": "assistant", "content": text}


def test_the_sessions_sampling_is_recorded_for_every_call(proxy):
    session, client = client_for(proxy, temperature=0.5, top_k=7, seed=11, max_tokens=9)
    history = [{"role": "user", "content": "Say something."}]
    history.append(ask(client, history, temperature=1.3, max_tokens=20))  # the session wins
    history.append({"role": "user", "content": "And again."})
    ask(client, history, stream=True)

    (segment,) = session.trace.to_dicts()
    assert segment["n_calls"] == 2
    assert segment["sampling_temperature"] == [0.5, 0.5]
    assert segment["sampling_top_p"] == [1.0, 1.0]
    assert segment["sampling_top_k"] == [7, 7]
    assert segment["sampling_max_tokens"] == [9, 9]  # the session's cap under the request's 20
    assert segment["sampling_seed"] == [11, 11]
    # Call 0's tokens start the response; call 1's start after them (its inserted user turn,
    # then what it sampled).
    first = session.trace.calls[0].completion_tokens
    assert segment["call_starts"] == [0, first]
    assert segment["loss_mask"][:first] == [1] * first
    assert segment["loss_mask"][first] == 0


def test_without_overrides_the_request_sampling_is_what_is_recorded(proxy):
    session, client = client_for(proxy)
    ask(client, [{"role": "user", "content": "Hi."}], temperature=0.25, top_p=0.9, max_tokens=5)
    (segment,) = session.trace.to_dicts()
    assert segment["sampling_temperature"] == [0.25]
    assert segment["sampling_top_p"] == [0.9]
    assert segment["sampling_max_tokens"] == [5]
    assert segment["sampling_seed"] == [None]


def test_a_retried_call_keeps_its_sampling_in_the_discarded_segment(proxy):
    session, client = client_for(proxy, temperature=0.8, max_tokens=4)
    messages = [{"role": "user", "content": "Once."}]
    ask(client, messages)
    ask(client, messages)  # the identical request again: a retry
    segments = session.trace.to_dicts()
    assert [s["role"] for s in segments] == ["agent", "discarded"]
    for segment in segments:
        assert segment["n_calls"] == 1
        assert segment["sampling_temperature"] == [0.8]
        assert segment["call_starts"] == [0]
