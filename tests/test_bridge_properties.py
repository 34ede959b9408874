"""Property tests of the append-only prompt bridge: token faithfulness and the append-only
invariant (docs/design.md, section 2).

The bridge is driven directly (no HTTP, no model) with the tiny tokenizer's renderer, so
hundreds of random episodes run in seconds. An episode is a sequence of operations on a
client-side message history, in OpenAI Chat shape and parsed the way the proxy parses it:

- the model answers: a completion is made from a random assistant text (optionally with
  Hermes `<tool_call>` blocks), ending with `<|im_end|>` or cut short without it; it is parsed
  as `model_call` parses it (incremental detokenizer + `HermesToolCallParser`) and committed;
  the client appends the turn the way a CLI does (arguments re-serialized compactly, an empty
  text sent as `""` or `None`), then tool results or a user message;
- edits: an earlier message changed (compaction), old messages dropped (truncation), the
  system prompt swapped;
- the identical request sent again (a retry), and side calls with a different tool set.

A small model of the contract, kept beside the bridge, says for each request which earlier turn
it extends (if any), whether it forks, and which assistant turns the model sees as the exact
text it sampled. The properties:

(a) every mask-1 span of every segment is exactly one of the completions produced, in the
    order the calls were placed there, with its logprobs, and every completion is in exactly one;
(b) each committed call's prompt ids are a prefix of its segment's tokens, its completion
    follows them;
(c) decoding a bridged prompt gives exactly the template render of the request's messages, the
    assistant turns we sampled standing as the text the model wrote (that is what it saw);
(d) the number of agent segments grows exactly when the client rewrote history it had already
    sent (never on pure appends or identical retries);
(e) per segment len(response_logprobs) == len(response_ids) == len(loss_mask), and logprobs
    are 0.0 where the mask is 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from harness_gym.engines.base import Completion
from harness_gym.engines.tiny import load_tiny_tokenizer
from harness_gym.proxy.bridge import PromptBridge, _chain
from harness_gym.proxy.canonical import AssistantTurn
from harness_gym.proxy.detokenize import IncrementalDetokenizer
from harness_gym.proxy.openai_chat import parse_chat_request
from harness_gym.proxy.rendering import PromptRenderer
from harness_gym.proxy.tool_parsers import HermesToolCallParser, TextDelta, ToolCallDone
from harness_gym.trace import SessionTrace

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
TITLE = {
    "type": "function",
    "function": {"name": "set_title", "description": "Name the session.",
                 "parameters": {"type": "object", "properties": {"title": {"type": "string"}}}},
}
AGENT_TOOLS = [BASH]
SIDE_TOOL_SETS = ([], [TITLE], [BASH, TITLE])


@pytest.fixture(scope="module")
def tok():
    tokenizer = load_tiny_tokenizer()
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return tokenizer, PromptRenderer(tokenizer, [im_end, eot]), im_end


# --- strategies ------------------------------------------------------------------------------

# No combining marks: NFC (the tokenizer's normalizer) is then the identity, and decoded text
# equals the text that was encoded. Whitespace and newlines matter to templates: include them.
_ALPHABET = st.sampled_from(list("abcxyz ABZ019_-.,:;!?'\"{}[]()<>/\\|=+*#@$%^&~`\n\t") +
                            ["é", "ß", "中", "文", "→", "😀", "  ", "\n\n", "<tool_call>",
                             "</tool_call>", "<tool_response>"])
TEXT = st.lists(_ALPHABET, max_size=12).map("".join)
PLAIN = st.lists(st.sampled_from(list("abcxyz ABZ019_-.,:\n") + ["é", "中"]),
                 max_size=10).map("".join)
JSON_LEAF = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | PLAIN | st.floats(
    allow_nan=False, allow_infinity=False, width=32)
JSON = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=2)
                    | st.dictionaries(PLAIN, inner, max_size=2), max_leaves=5)
ARGUMENTS = st.one_of(
    st.fixed_dictionaries({"command": PLAIN}),
    st.dictionaries(PLAIN, JSON, max_size=3),
    JSON,
)


@st.composite
def completion_texts(draw) -> str:
    """What the model writes: text, then zero or more Hermes tool calls in varied spacing."""
    text = draw(TEXT)
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(["bash", "set_title", "bash"]))
        body = {"name": name, "arguments": draw(ARGUMENTS)}
        compact = draw(st.booleans())
        raw = json.dumps(body, ensure_ascii=draw(st.booleans()),
                         separators=(",", ":") if compact else None)
        text += draw(st.sampled_from(["\n", "", "\n\n", " "])) + "<tool_call>" + draw(
            st.sampled_from(["\n", ""])) + raw + draw(st.sampled_from(["\n", ""])) + "</tool_call>"
    return text


OPS = st.one_of(
    st.tuples(st.just("answer"), completion_texts(), st.integers(0, 10**6), st.booleans(),
              st.sampled_from(["", None]), st.lists(TEXT, max_size=2)),
    st.tuples(st.just("answer"), completion_texts(), st.integers(0, 10**6), st.booleans(),
              st.sampled_from(["", None]), st.lists(TEXT, max_size=2)),
    st.tuples(st.just("answer"), completion_texts(), st.integers(0, 10**6), st.booleans(),
              st.sampled_from(["", None]), st.lists(TEXT, max_size=2)),
    st.tuples(st.just("answer"), completion_texts(), st.integers(0, 10**6), st.booleans(),
              st.sampled_from(["", None]), st.lists(TEXT, max_size=2)),
    st.tuples(st.just("retry"), completion_texts(), st.integers(0, 10**6), st.booleans()),
    st.tuples(st.just("compact"), st.integers(0, 50), TEXT),
    st.tuples(st.just("truncate"), st.integers(1, 4)),
    st.tuples(st.just("swap_system"), TEXT),
    st.tuples(st.just("side"), completion_texts(), st.integers(0, 10**6), st.booleans(),
              st.sampled_from(range(len(SIDE_TOOL_SETS))), TEXT),
)


# --- the model of the contract ---------------------------------------------------------------


@dataclass
class Call:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    request_key: bytes
    turn_chain: bytes
    spec: list[dict[str, Any]]  # the messages whose render the prompt must decode to
    raw: str  # the completion as text, without its end-of-turn token
    segment: int  # index in Model.segments


@dataclass
class Model:
    agent_tools_key: bytes | None = None
    calls: list[Call] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)  # role, live call indices
    requests: dict[bytes, int] = field(default_factory=dict)
    turns: dict[bytes, int] = field(default_factory=dict)

    def is_tail(self, index: int) -> bool:
        seg = self.segments[self.calls[index].segment]
        return seg["role"] != "discarded" and seg["calls"] and seg["calls"][-1] == index

    def expect(self, request, messages: list[dict]) -> tuple[list[dict], str, int | None]:
        """(spec, placement, parent call) for a request, as the contract says."""
        chain = [request.tools_key()]
        for m in request.messages:
            chain.append(_chain(chain[-1], m.semantic_key()))
        if chain[-1] in self.requests:
            index = self.requests[chain[-1]]
            return self.calls[index].spec, "retry" if self.is_tail(index) else "branch", index
        for position in range(len(messages) - 1, -1, -1):
            if request.messages[position].role != "assistant":
                continue
            index = self.turns.get(chain[position + 1])
            if index is None:
                continue
            parent = self.calls[index]
            spec = parent.spec + [{"role": "assistant", "content": parent.raw}] + messages[
                position + 1:]
            return spec, "extend" if self.is_tail(index) else "branch", index
        return list(messages), "new", None


def make_completion(tokenizer, renderer, im_end, text: str, seed: int, closed: bool):
    ids = renderer.encode(text)
    if closed:
        ids.append(im_end)
    else:
        ids = ids[: max(1, len(ids) - seed % 4)] if ids else [renderer.encode("x")[0]]
    logprobs = [-((seed + i) % 97 + 1) / 7.0 for i in range(len(ids))]
    completion = Completion(list(ids), logprobs, "stop" if closed else "length", seed % 3)
    # Parse as model_call does: token by token through the detokenizer and the parser.
    detokenizer = IncrementalDetokenizer(tokenizer)
    parser = HermesToolCallParser()
    events = []
    for i, token in enumerate(ids):
        delta = detokenizer.push([token])
        if i == len(ids) - 1:
            delta += detokenizer.flush()
        events += parser.feed(delta)
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = tuple(e.call for e in events if isinstance(e, ToolCallDone))
    reason = completion.finish_reason
    turn = AssistantTurn(content, calls, "tool_calls" if calls and reason == "stop" else reason)
    raw = tokenizer.backend_tokenizer.decode(ids[:-1] if closed else ids,
                                             skip_special_tokens=False)
    return completion, turn, raw


def echo_like_a_cli(turn: AssistantTurn, empty: str | None) -> dict:
    out: dict[str, Any] = {"role": "assistant", "content": turn.content or empty}
    if turn.tool_calls:
        out["tool_calls"] = []
        for call in turn.tool_calls:
            arguments = call.arguments_json()
            try:
                arguments = json.dumps(json.loads(arguments), separators=(",", ":"),
                                       ensure_ascii=False)
            except ValueError:
                pass
            out["tool_calls"].append({"id": call.id, "type": "function",
                                      "function": {"name": call.name, "arguments": arguments}})
    return out


# --- the property ----------------------------------------------------------------------------


def run_episode(tok, first_user: str, system: str | None, ops) -> dict:
    tokenizer, renderer, im_end = tok
    trace = SessionTrace()
    bridge = PromptBridge(renderer, trace)
    model = Model()
    history: list[dict] = ([{"role": "system", "content": system}] if system is not None
                           else []) + [{"role": "user", "content": first_user}]
    last_main: list[dict] | None = None  # the last main request, as sent
    sent_since: bool = False  # has the history been only appended to since last_main?
    stats = {"forks": 0, "extends": 0, "retries": 0}
    ops = list(ops)
    ops.insert(0, ("answer", "Let me look.", 1, True, None, ["go"]))

    def call(messages: list[dict], tools: list[dict], text: str, seed: int, closed: bool,
             edited: bool | None):
        request = parse_chat_request({"messages": messages, "tools": tools})
        spec, placement, parent = model.expect(
            request, [m.template_dict() for m in request.messages])
        plan = bridge.plan(request)
        prompt_ids = list(plan.prompt_ids)
        if currently_in_test_context():
            event(f"placement: {placement}")
        # (c) the model sees exactly the render of the messages, our turns as we sampled them
        seen = tokenizer.backend_tokenizer.decode(plan.prompt_ids, skip_special_tokens=False)
        assert seen == renderer.render_text(spec, tools or None), placement
        completion, turn, raw = make_completion(tokenizer, renderer, im_end, text, seed, closed)
        agents_before = sum(1 for s in trace.segments if s.role == "agent")
        node = bridge.commit(plan, completion, turn, 0.0)
        agents_after = sum(1 for s in trace.segments if s.role == "agent")

        # Update the model of the contract.
        if model.agent_tools_key is None:
            model.agent_tools_key = request.tools_key()
        role = "agent" if request.tools_key() == model.agent_tools_key else "auxiliary"
        if placement == "retry":
            old = model.calls[parent]
            segment = old.segment
            model.segments[segment]["calls"].pop()
            model.segments.append({"role": "discarded", "calls": [parent]})
            old.segment = len(model.segments) - 1
            model.turns.pop(old.turn_chain, None)
        elif placement == "extend":
            segment = model.calls[parent].segment
        else:
            model.segments.append({"role": role, "calls": []})
            segment = len(model.segments) - 1
        assert node.segment == segment, (placement, node.segment, segment)
        index = len(model.calls)
        model.segments[segment]["calls"].append(index)
        request_key = plan.request_key
        turn_chain = _chain(request_key, turn.as_message().semantic_key())
        model.calls.append(Call(prompt_ids, list(completion.token_ids),
                                list(completion.logprobs), request_key, turn_chain, spec, raw,
                                segment))
        model.requests[request_key] = index
        model.turns[turn_chain] = index
        # (d) agent segments grow exactly on a fork of the agent's conversation
        forked = placement in ("new", "branch") and role == "agent"
        assert agents_after - agents_before == int(forked), placement
        if edited is False:  # a pure append or an identical retry never forks
            assert not forked, placement
        stats["forks" if forked else "extends" if placement == "extend" else "retries"] += (
            role == "agent")
        return turn

    for op in ops:
        kind = op[0]
        if kind == "answer":
            _, text, seed, closed, empty, followups = op
            edited = None if last_main is None else not sent_since
            turn = call(history, AGENT_TOOLS, text, seed, closed,
                        False if edited is False else None)
            last_main = [dict(m) for m in history]
            history.append(echo_like_a_cli(turn, empty))
            for i, tool_call in enumerate(turn.tool_calls):
                history.append({"role": "tool", "tool_call_id": tool_call.id,
                                "content": followups[i] if i < len(followups) else "ok"})
            if not turn.tool_calls and followups:
                history.append({"role": "user", "content": followups[0]})
            sent_since = True
        elif kind == "retry" and last_main is not None:
            _, text, seed, closed = op
            history = [dict(m) for m in last_main]
            turn = call(history, AGENT_TOOLS, text, seed, closed, False)
            history.append(echo_like_a_cli(turn, None))
            history.append({"role": "user", "content": "continue"})
            sent_since = True
        elif kind == "compact" and len(history) > 1:
            _, where, text = op
            i = len(history) - 1 - where % len(history)  # recent messages more often
            message = dict(history[i])
            message["content"] = "summary: " + text
            history[i] = message
            sent_since = False
        elif kind == "truncate":
            start = 1 if history and history[0]["role"] == "system" else 0
            drop = min(op[1], len(history) - start - 1)
            if drop > 0:
                del history[start:start + drop]
                sent_since = False
        elif kind == "swap_system":
            new = {"role": "system", "content": "policy " + op[1]}
            if history and history[0]["role"] == "system":
                history[0] = new
            else:
                history.insert(0, new)
            sent_since = False
        elif kind == "side":
            _, text, seed, closed, which, question = op
            call([{"role": "user", "content": "title? " + question}], SIDE_TOOL_SETS[which],
                 text, seed, closed, None)
    check_trace(trace, model)
    return stats


def check_trace(trace: SessionTrace, model: Model) -> None:
    assert len(trace.segments) == len(model.segments)
    assert [s.role for s in trace.segments] == [s["role"] for s in model.segments]
    seen_calls = []
    for number, segment in enumerate(trace.segments):
        data = segment.to_dict()
        ids, mask, logprobs = data["response_ids"], data["loss_mask"], data["response_logprobs"]
        # (e)
        assert len(ids) == len(mask) == len(logprobs)
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
        assert set(mask) <= {0, 1}
        # (a) the mask-1 spans are this segment's completions, in order, with their logprobs
        spans, start = [], None
        for i, m in enumerate([*mask, 0]):
            if m == 1 and start is None:
                start = i
            elif m == 0 and start is not None:
                spans.append((ids[start:i], logprobs[start:i]))
                start = None
        calls = model.segments[number]["calls"]
        assert spans == [(model.calls[c].completion_ids, model.calls[c].logprobs) for c in calls]
        assert segment.n_calls == len(calls)
        seen_calls += calls
        # (b) each call's prompt is a prefix of its segment, its completion follows it
        for c in calls:
            call = model.calls[c]
            n = len(call.prompt_ids)
            assert segment.tokens[:n] == call.prompt_ids
            assert segment.tokens[n:n + len(call.completion_ids)] == call.completion_ids
            assert trace.calls[c].segment == number
    assert sorted(seen_calls) == list(range(len(model.calls)))


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(first_user=TEXT, system=st.none() | TEXT, ops=st.lists(OPS, min_size=3, max_size=16))
def test_random_episodes_keep_the_bridge_contract(tok, first_user, system, ops):
    run_episode(tok, first_user, system, ops)


def test_a_pure_append_episode_is_one_agent_segment(tok):
    ops = [("answer", '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
            i, True, empty, ["out"]) for i, empty in zip(range(6), ["", None] * 3)]
    stats = run_episode(tok, "fix it", "be careful", ops)
    assert stats["forks"] == 1 and stats["extends"] == 6


def test_every_edit_kind_forks_once(tok):
    answer = ("answer", "ok", 3, True, None, ["next"])
    for edit in [("compact", 1, "short"), ("truncate", 1), ("swap_system", "new rules")]:
        stats = run_episode(tok, "fix it", "be careful", [answer, edit, answer])
        assert stats["forks"] == 2, edit


def test_committing_a_new_segment_leaves_the_plans_prompt_and_the_call_record_alone(tok):
    """The prompt a call was given (and the usage its client is told, which `model_call` reads
    from `plan.prompt_ids` after the commit) must not grow by the completion's tokens."""
    tokenizer, renderer, im_end = tok
    trace = SessionTrace()
    bridge = PromptBridge(renderer, trace)
    request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}]})
    plan = bridge.plan(request)
    prompt = list(plan.prompt_ids)
    completion, turn, _ = make_completion(tokenizer, renderer, im_end, "hello", 0, True)
    bridge.commit(plan, completion, turn, 0.0)
    assert plan.prompt_ids == prompt
    assert trace.calls[0].prompt_tokens == len(prompt)


@pytest.mark.parametrize("arguments", ['""', '"  "'])
def test_a_tool_call_with_blank_string_arguments_extends_on_a_pure_append(tok, arguments):
    call = f'<tool_call>\n{{"name": "bash", "arguments": {arguments}}}\n</tool_call>'
    ops = [("answer", call, 1, True, None, ["out"]), ("answer", "done", 2, True, None, [])]
    stats = run_episode(tok, "fix it", "be careful", ops)
    assert stats["forks"] == 1
