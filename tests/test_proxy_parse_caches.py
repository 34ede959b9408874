"""The two caches that keep a call's work from growing with the conversation: a session's parsed
messages (`message_cache`) and the ids of whole rendered turns (`rendering.TurnIdsCache`).
Each must give exactly what the uncached path gives."""

from __future__ import annotations

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness_gym.engines import load_engine
from harness_gym.engines.tiny import load_tiny_tokenizer
from harness_gym.proxy import InterceptionProxy
from harness_gym.proxy.anthropic_messages import parse_messages_request
from harness_gym.proxy.errors import ProxyError
from harness_gym.proxy.message_cache import MessageParseCache
from harness_gym.proxy.openai_chat import parse_chat_request
from harness_gym.proxy.rendering import PromptRenderer, turn_ids_cache

SYSTEM = "You are a coding agent. Read before you edit.\n" * 120  # 5.5 KB: a cached turn


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


def renderer_for(tokenizer) -> PromptRenderer:
    return PromptRenderer(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")])


def history(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix it"}]
    for turn in range(turns):
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": f"c{turn}", "type": "function",
                "function": {"name": "bash", "arguments": f'{{"command": "ls {turn}"}}'}}]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": f"file_{turn}.py"},
        ]
    return messages


# --- parsed messages ----------------------------------------------------------------------------


def test_a_resent_history_is_parsed_once_and_parses_to_the_same_request():
    cache = MessageParseCache()
    first = parse_chat_request({"messages": history(2)}, cache)
    assert (cache.hits, cache.misses) == (0, 6)
    later = parse_chat_request({"messages": history(5)}, cache)
    assert (cache.hits, cache.misses) == (6, 12)  # only the 6 new messages were parsed
    assert later == parse_chat_request({"messages": history(5)})  # exactly the uncached parse
    assert later.messages[:6] == first.messages


def test_a_message_that_failed_to_parse_fails_again_where_it_now_sits():
    cache = MessageParseCache()
    bad = {"role": "tool", "content": "no tool_call_id"}
    for at in (1, 3):
        messages = history(1)[: at] + [bad]
        with pytest.raises(ProxyError) as error:
            parse_chat_request({"messages": messages}, cache)
        assert error.value.param == f"messages[{at}].tool_call_id"
    assert cache.hits == 1  # the good message before it; the bad one was never stored


def test_the_same_json_in_two_dialects_is_parsed_by_each():
    cache = MessageParseCache()
    user = {"role": "user", "content": "hi"}
    chat = parse_chat_request({"messages": [user]}, cache)
    messages = parse_messages_request({"messages": [user], "max_tokens": 8}, cache)
    assert chat.messages == messages.messages and cache.hits == 0


def test_the_cache_is_bounded():
    cache = MessageParseCache(max_entries=4)
    parse_chat_request({"messages": history(4)}, cache)
    assert len(cache) == 4


def test_a_sessions_calls_parse_only_the_messages_they_add():
    engine = load_engine("tiny")
    try:
        with InterceptionProxy(engine) as proxy:
            session = proxy.open_session(sampling={"max_tokens": 4})
            client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                   max_retries=0)
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]
            for turn in range(4):
                answer = client.chat.completions.create(model="tiny", messages=messages)
                messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                             {"role": "user", "content": f"turn {turn}"}]
            cache = session.parsed_messages
            # 2 messages at the first call, 2 more at each later one; all earlier ones reused.
            assert cache.misses == 2 + 2 * 3 and cache.hits == 2 + 4 + 6
            (segment,) = session.trace.snapshot().to_dicts()  # the bridge still extends
            assert segment["n_calls"] == 4
    finally:
        engine.close()


# --- ids of whole turns -------------------------------------------------------------------------


def test_a_cached_turn_encodes_to_the_ids_of_the_whole_text(tokenizer):
    renderer = renderer_for(tokenizer)
    text = renderer.render_text(history(3))
    whole = tokenizer.encode(text, add_special_tokens=False)
    assert renderer.encode(text) == whole and renderer.turn_ids.hits == 0
    assert len(renderer.turn_ids) == 1  # the system turn; the short ones are not kept
    assert renderer.encode(text) == whole and renderer.turn_ids.hits == 1
    assert renderer.encode(text, budget=len(whole) + 10) == whole


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([*"ab \n\t.çé中<|>_", "<|im_end|>", "\n<|im_start|>"]),
                         max_size=2000).map("".join), min_size=1, max_size=4))
def test_turns_of_any_text_encode_as_the_tokenizer_does_cached_or_not(tokenizer, contents):
    renderer = renderer_for(tokenizer)
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": c}
                 for i, c in enumerate(contents)]
    text = renderer.render_text(messages)
    whole = tokenizer.encode(text, add_special_tokens=False)
    assert renderer.encode(text) == whole
    assert renderer.encode(text) == whole  # now from the cache


def test_a_new_session_of_the_same_cli_reuses_the_ids_of_its_opening(tokenizer):
    engine = load_engine("tiny")
    try:
        with InterceptionProxy(engine) as proxy:
            ids = []
            for _ in range(2):
                session = proxy.open_session(sampling={"max_tokens": 2})
                client = openai.OpenAI(base_url=proxy.base_url, api_key=session.session_id,
                                       max_retries=0)
                client.chat.completions.create(model="tiny", messages=history(0))
                ids.append(session.trace.snapshot().to_dicts()[0]["prompt_ids"])
            assert proxy.renderer.turn_ids.hits >= 1
            expected = tokenizer.apply_chat_template(history(0), add_generation_prompt=True,
                                                     return_dict=False)
            assert ids == [expected, expected]
    finally:
        engine.close()


def test_the_turn_cache_holds_at_most_its_token_budget():
    cache = turn_ids_cache(max_tokens=10)
    cache.put("a", (1,) * 6)
    cache.put("b", (2,) * 6)  # 12 > 10: "a" goes
    assert cache.get("a") is None and cache.get("b") == (2,) * 6 and cache.weight == 6
    cache.put("c", (3,) * 11)  # larger than the whole budget: never kept
    assert cache.get("c") is None
