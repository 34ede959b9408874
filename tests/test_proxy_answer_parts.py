"""The parts a model call's answer passes through, each alone: stop strings, token chunks to
text, text to tool-call events and the recorded turn, and the keep-alive ticker."""

from __future__ import annotations

import asyncio

import pytest

from harness_gym.engines.base import TokenChunk
from harness_gym.engines.tiny import load_tiny_tokenizer
from harness_gym.proxy.answer import AnswerText, ParsedAnswer, StopStrings
from harness_gym.proxy.events import KeepAlive, TextDelta, ToolCallDone
from harness_gym.proxy.model_call import keepalives_until
from harness_gym.proxy.tool_parsers import HermesToolCallParser


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


def test_a_stop_string_split_across_deltas_ends_the_answer_before_it():
    stops = StopStrings(["END", "###"])
    assert stops.cut("hello E") == "hello E"  # "E" alone is not a stop yet
    assert stops.cut("NDtail") == ""  # the stop began in the previous delta: nothing more
    assert stops.hit == "END"
    assert stops.cut("more text") == ""


def test_the_earliest_of_several_stop_strings_wins():
    stops = StopStrings(["zz", "b"])
    assert stops.cut("aabzz") == "aa"
    assert stops.hit == "b"


def test_no_stop_strings_pass_text_through_untouched():
    stops = StopStrings([])
    assert stops.cut("anything ###") == "anything ###"
    assert stops.hit is None


def test_token_chunks_become_text_with_split_characters_held_until_complete(tokenizer):
    ids = tokenizer.encode("héllo 中文 done", add_special_tokens=False)
    text = AnswerText(tokenizer, [])
    pieces = [text.push(TokenChunk([i], [0.0])) for i in ids[:-1]]
    pieces.append(text.push(TokenChunk([ids[-1]], [0.0], "stop")))
    assert "".join(pieces) == "héllo 中文 done"
    assert "\ufffd" not in "".join(pieces)


def test_answer_text_stops_at_a_stop_string_and_names_it(tokenizer):
    ids = tokenizer.encode("first part STOP second part", add_special_tokens=False)
    text = AnswerText(tokenizer, ["STOP"])
    out = "".join(text.push(TokenChunk([i], [0.0])) for i in ids)
    assert out == "first part "
    assert text.stop_hit == "STOP"


def test_a_parsed_answer_streams_text_and_whole_tool_calls_and_adds_up_to_the_turn():
    answer = ParsedAnswer(HermesToolCallParser())
    events = []
    for delta in ["Let me look.\n<tool", '_call>\n{"name": "bash", "argu',
                  'ments": {"command": "ls"}}\n</tool_call>']:
        events += answer.feed(delta)
    events += answer.finish()
    assert events[0] == TextDelta("Let me look.")
    (call,) = [e.call for e in events if isinstance(e, ToolCallDone)]
    assert (call.name, call.arguments) == ("bash", {"command": "ls"})
    turn = answer.turn("stop")
    assert turn.content == "Let me look." and turn.tool_calls == (call,)
    assert turn.finish_reason == "tool_calls"
    assert answer.turn("length").finish_reason == "length"  # cut short stays cut short


def test_a_malformed_tool_call_stays_text_in_the_turn():
    answer = ParsedAnswer(HermesToolCallParser())
    answer.feed("<tool_call>not json</tool_call>")
    answer.finish()
    turn = answer.turn("stop")
    assert turn.tool_calls == () and turn.content == "<tool_call>not json</tool_call>"
    assert turn.finish_reason == "stop"


def test_keepalives_tick_until_the_first_chunk_arrives():
    async def scenario() -> list[object]:
        first: asyncio.Future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.12, first.set_result, None)
        return [ping async for ping in keepalives_until(first, 0.025)]

    pings = asyncio.run(scenario())
    assert 3 <= len(pings) <= 5 and all(isinstance(p, KeepAlive) for p in pings)


def test_no_keepalive_when_the_first_chunk_is_already_there():
    async def scenario() -> list[object]:
        first: asyncio.Future = asyncio.get_running_loop().create_future()
        first.set_result(None)
        return [ping async for ping in keepalives_until(first, 0.01)]

    assert asyncio.run(scenario()) == []
