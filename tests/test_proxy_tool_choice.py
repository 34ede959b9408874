"""`tool_choice` is obeyed and parallel tool calls round-trip, in every dialect, through the
official SDKs over real HTTP.

The policy is a `ScriptedEngine` over `tiny`: its words come from a script that reads the prompt
(so it sees the tool-call prefix the proxy forced), its logprobs are tiny's real scores.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from support.dialect_clients import DialectClient
from support.engines import RecordingEngine
from support.thinking import thinking_tokenizer
from test_proxy_openai_chat import assert_segment_is_what_the_engine_sampled

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy

DIALECTS = ["anthropic", "chat", "responses"]
CALL = '{"name": "bash", "arguments": {"command": "ls"}}'


def wants_to_call(prompt: str) -> str:
    """A policy that always calls bash on its own, and continues any forced prefix."""
    if prompt.endswith('"arguments": '):
        return '{"command": "pwd"}}\n</tool_call>'
    if prompt.endswith("<tool_call>\n"):
        return CALL + "\n</tool_call>"
    return f"Let me look.\n<tool_call>\n{CALL}\n</tool_call>"


def never_calls(prompt: str) -> str:
    """A policy that answers in prose unless the answer was started for it."""
    if prompt.endswith('"arguments": '):
        return '{"command": "pwd"}}\n</tool_call>'
    if prompt.endswith("<tool_call>\n"):
        return CALL + "\n</tool_call>"
    return "I would rather talk."


def calls_twice(prompt: str) -> str:
    """Two calls in one answer until two results came back, then done."""
    if prompt.count("<tool_response>") >= 2:
        return "Both done."
    if prompt.endswith("<tool_call>\n"):
        prompt, prefix = prompt, ""
    else:
        prefix = "Two at once.\n<tool_call>\n"
    return (prefix + '{"name": "bash", "arguments": {"command": "echo a"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "bash", "arguments": {"command": "echo b"}}\n</tool_call>')


def session_for(proxy, dialect, tools=("bash",)):
    session = proxy.open_session()
    return session, DialectClient.open(dialect, proxy, session, list(tools))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_choice_none_answers_in_text_even_when_the_policy_wants_a_tool(tiny, dialect, stream):
    engine = RecordingEngine(ScriptedEngine(tiny, wants_to_call))
    with InterceptionProxy(engine) as proxy:
        session, client = session_for(proxy, dialect)
        answer = client.ask("Fix the bug.", stream=stream, **client.choice("none"))
        assert answer.calls == [] and answer.text == "Let me look."
        assert "<tool_call>" not in answer.text
        # Not reported as a stop sequence the client never asked for.
        assert answer.stop in ("end_turn", "stop", "completed")
        # The tools stayed in the prompt: the conversation is the agent's, not a new one.
        assert "<tools>" in tiny.tokenizer.decode(engine.calls[0]["prompt_ids"])
        [segment] = session.trace_json()["segments"]
        assert segment["forced_tokens"] == [0]
        assert_segment_is_what_the_engine_sampled(segment, engine.calls, tiny)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_required_steers_a_prose_policy_into_a_tool_call_recorded_as_forced(tiny, dialect, stream):
    engine = RecordingEngine(ScriptedEngine(tiny, never_calls))
    with InterceptionProxy(engine) as proxy:
        session, client = session_for(proxy, dialect)
        answer = client.ask("Fix the bug.", stream=stream, **client.choice("required"))
        assert [(name, args) for _, name, args in answer.calls] == [("bash", {"command": "ls"})]
        [segment] = session.trace_json()["segments"]
        forced = segment["forced_tokens"][0]
        assert forced > 0
        # The forced prefix is in the response, masked out of the loss, with no p_old.
        head = segment["response_ids"][:forced]
        assert tiny.tokenizer.decode(head) == "<tool_call>\n"
        assert segment["loss_mask"][:forced] == [0] * forced
        assert segment["response_logprobs"][:forced] == [0.0] * forced
        assert all(segment["loss_mask"][forced:])
        # The engine continued the prompt + forced tokens; every sampled token is its own.
        assert engine.calls[0]["prompt_ids"] == segment["prompt_ids"] + head
        assert_segment_is_what_the_engine_sampled(segment, engine.calls, tiny)

        # Echoed back with its result, the next turn (auto: prose) extends the same segment.
        client.echo(answer, ["file.txt"])
        final = client.ask(stream=stream)
        assert final.text == "I would rather talk." and not final.calls
        [segment] = session.trace_json()["segments"]
        assert segment["forced_tokens"] == [forced, 0] and segment["n_calls"] == 2
        assert_segment_is_what_the_engine_sampled(segment, engine.calls, tiny)


@pytest.mark.parametrize("opened", [False, True], ids=["thinks-by-choice", "prompt-opens-think"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_forced_call_from_a_thinking_policy_is_a_call_not_reasoning(tiny, dialect, opened):
    """Reasoning is split off before tool calls are parsed, so where the generation prompt
    opened `<think>` the forced prefix closes it first; either way the client gets the call."""
    engine = RecordingEngine(ScriptedEngine(tiny, never_calls,
                                            tokenizer=thinking_tokenizer(opened=opened)))
    with InterceptionProxy(engine) as proxy:
        session, client = session_for(proxy, dialect)
        answer = client.ask("Fix the bug.", **client.choice("required"))
        assert [(name, args) for _, name, args in answer.calls] == [("bash", {"command": "ls"})]
        [segment] = session.trace_json()["segments"]
        forced = segment["forced_tokens"][0]
        head = tiny.tokenizer.decode(segment["response_ids"][:forced])
        assert head == ("</think>\n\n<tool_call>\n" if opened else "<tool_call>\n")
        assert segment["loss_mask"][:forced] == [0] * forced
        assert_segment_is_what_the_engine_sampled(segment, engine.calls, tiny)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_named_tool_is_the_one_called(tiny, dialect):
    engine = RecordingEngine(ScriptedEngine(tiny, wants_to_call))
    with InterceptionProxy(engine) as proxy:
        session, client = session_for(proxy, dialect, tools=("bash", "read"))
        answer = client.ask("Fix the bug.", **client.choice("named", "read"))
        assert [(name, args) for _, name, args in answer.calls] == [("read", {"command": "pwd"})]
        [segment] = session.trace_json()["segments"]
        forced = segment["forced_tokens"][0]
        assert tiny.tokenizer.decode(segment["response_ids"][:forced]) == (
            '<tool_call>\n{"name": "read", "arguments": ')
        assert_segment_is_what_the_engine_sampled(segment, engine.calls, tiny)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_parallel_tool_calls_round_trip_as_one_segment(tiny, dialect, stream):
    engine = RecordingEngine(ScriptedEngine(tiny, calls_twice))
    with InterceptionProxy(engine) as proxy:
        session, client = session_for(proxy, dialect)
        answer = client.ask("Fix the bug.", stream=stream)
        assert [args["command"] for _, _, args in answer.calls] == ["echo a", "echo b"]
        assert len({call_id for call_id, _, _ in answer.calls}) == 2
        client.echo(answer, ["a", "b"])
        final = client.ask(stream=stream)
        assert final.text == "Both done."
        [segment] = session.trace_json()["segments"]
        assert segment["n_calls"] == 2 and segment["role"] == "agent"
        # Both results reached the model, in order.
        second_prompt = tiny.tokenizer.decode(engine.calls[1]["prompt_ids"])
        assert second_prompt.index("\na\n</tool_response>") < second_prompt.index(
            "\nb\n</tool_response>")
        assert_segment_is_what_the_engine_sampled(segment, engine.calls, tiny)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_parallel_calls_switched_off_send_only_the_first(tiny, dialect):
    engine = RecordingEngine(ScriptedEngine(tiny, calls_twice))
    with InterceptionProxy(engine) as proxy:
        session, client = session_for(proxy, dialect)
        answer = client.ask("Fix the bug.", **client.choice("auto", parallel=False))
        assert [args["command"] for _, _, args in answer.calls] == ["echo a"]
        # The one call is echoed back; the next turn still extends the segment.
        client.echo(answer, ["a"])
        client.ask()
        [segment] = session.trace_json()["segments"]
        assert segment["n_calls"] == 2
        assert_segment_is_what_the_engine_sampled(segment, engine.calls, tiny)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_tool_choice_naming_an_unknown_tool_is_a_400_and_records_nothing(tiny, dialect):
    with InterceptionProxy(ScriptedEngine(tiny, never_calls)) as proxy:
        session, client = session_for(proxy, dialect)
        errors = (anthropic.BadRequestError, openai.BadRequestError)
        with pytest.raises(errors) as raised:
            client.ask("Fix the bug.", **client.choice("named", "rm_rf"))
        assert "rm_rf" in str(raised.value)
        assert session.trace_json()["segments"] == []


def test_responses_echo_the_tool_choice_they_obeyed(tiny):
    with InterceptionProxy(ScriptedEngine(tiny, never_calls)) as proxy:
        session, client = session_for(proxy, "responses")
        response = client.client.responses.create(
            model="policy", input="Fix it.", store=False, tools=client._tools(),
            tool_choice={"type": "function", "name": "bash"}, parallel_tool_calls=False)
        assert response.tool_choice.name == "bash" and response.parallel_tool_calls is False
        assert json.loads(response.output[0].arguments) == {"command": "pwd"}
