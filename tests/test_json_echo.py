"""Numbers in tool arguments, as each CLI's runtime echoes them: the bridge recognises its own
turn, and never takes two different numbers for one.

The oracles are the real runtimes, one long-lived process each: node (Pi runs on it), Bun's
JavaScriptCore (OpenCode's binary run as Bun via `BUN_BE_BUN=1`; Claude Code is a Bun binary too,
but does not take that switch: the real-CLI test in test_harness_fidelity.py covers it), and
Python's json (Hermes). Each applies `JSON.stringify(JSON.parse(s))`, or
`json.dumps(json.loads(s))`, to what the proxy sent the CLI; the echo is parsed the way the proxy
parses a request, and the model's side the way it parses a completion.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness_gym.harness import load_harness
from harness_gym.proxy.anthropic_messages import parse_messages_request, tool_input
from harness_gym.proxy.canonical import Message, ToolCall
from harness_gym.proxy.json_echo import echo_key, js_number
from harness_gym.proxy.openai_chat import parse_chat_request
from harness_gym.proxy.tool_parsers import parse_hermes_body

ROUND_TRIP_JS = (
    "const rl = require('readline').createInterface({input: process.stdin});"
    "rl.on('line', (line) => console.log(JSON.stringify(JSON.parse(line))));"
)

RoundTrip = Callable[[str], str]


class LineOracle:
    """A runtime that answers one JSON round trip per line."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, encoding="utf-8", env=env)

    def __call__(self, text: str) -> str:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().rstrip("\n")

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=30)


def _runtime(name: str) -> Iterator[RoundTrip]:
    if name == "python":
        yield lambda text: json.dumps(json.loads(text))
        return
    if name == "node":
        if shutil.which("node") is None:
            pytest.skip("node is not installed")
        oracle = LineOracle(["node", "-e", ROUND_TRIP_JS])
    else:
        opencode = load_harness("opencode")
        if not opencode.is_installed():
            pytest.skip("OpenCode is not installed (`harness-gym harnesses --install`)")
        oracle = LineOracle([str(opencode.executable()), "-e", ROUND_TRIP_JS],
                            env={"BUN_BE_BUN": "1", "PATH": "/usr/bin:/bin"})
    try:
        assert oracle('{"probe":1.0}') == '{"probe":1}', "not a JavaScript runtime"
        yield oracle
    finally:
        oracle.close()


@pytest.fixture(scope="module")
def node() -> Iterator[RoundTrip]:
    yield from _runtime("node")


@pytest.fixture(scope="module", params=["node", "bun", "python"])
def runtime(request: pytest.FixtureRequest) -> Iterator[RoundTrip]:
    yield from _runtime(request.param)


# JSON number spellings: sign, 1-25 digit integer part, optional fraction and exponent.
_digits = st.text("0123456789", min_size=1, max_size=25)
_integer = st.one_of(st.just("0"), st.builds(lambda d, rest: d + rest,
                                             st.sampled_from("123456789"),
                                             st.text("0123456789", max_size=24)))
spellings = st.builds(
    lambda sign, whole, frac, exp: sign + whole + frac + exp,
    st.sampled_from(["", "-"]),
    _integer,
    st.one_of(st.just(""), st.builds(lambda d: "." + d, _digits)),
    st.one_of(st.just(""), st.builds(lambda e, s, d: e + s + d, st.sampled_from("eE"),
                                     st.sampled_from(["", "+", "-"]),
                                     st.text("0123456789", min_size=1, max_size=3))),
)
MUST = ["120000.0", "1e5", "12345678901234567890", "123456789012345678901",
        "9007199254740993", "-0", "0.1", "1e400", "-1e400", "1e-400", "5e-324"]


def model_call(spelling: str) -> ToolCall:
    """The model wrote a tool call with this number in it; parsed as the proxy parses it."""
    body = '{"name": "bash", "arguments": {"command": "sleep 1", "timeout": %s}}' % spelling
    call = parse_hermes_body(body)
    if call is None:  # orjson refused the body (an overflowing number): kept as text
        call = ToolCall("call_1", "bash", '{"command": "sleep 1", "timeout": %s}' % spelling)
    return call


def chat_echo(call: ToolCall, round_trip: RoundTrip) -> ToolCall:
    """What an OpenAI-chat CLI sends back for the call the proxy sent it."""
    echoed = round_trip(call.arguments_json())
    body = {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": call.name, "arguments": echoed}}]}]}
    (message,) = parse_chat_request(body).messages
    return message.tool_calls[0]


def key(call: ToolCall) -> bytes:
    return Message("assistant", "", (call,)).semantic_key()


def test_the_documented_spellings_come_back_from_javascript_as_measured(node: RoundTrip) -> None:
    assert node('{"a":120000.0,"b":1e5,"c":12345678901234567890,"d":-0,"e":1e400}') == (
        '{"a":120000,"b":100000,"c":12345678901234567000,"d":0,"e":null}')


@pytest.mark.parametrize("spelling", MUST)
def test_each_runtime_echo_of_a_hard_number_is_recognised(runtime: RoundTrip, spelling: str):
    call = model_call(spelling)
    assert key(chat_echo(call, runtime)) == key(call)


@settings(max_examples=400, deadline=None)
@given(spelling=spellings)
def test_every_runtime_echo_is_recognised_as_the_turn_we_sampled(
    runtime: RoundTrip, spelling: str
) -> None:
    call = model_call(spelling)
    assert key(chat_echo(call, runtime)) == key(call)


@settings(max_examples=400, deadline=None)
@given(a=st.one_of(spellings, st.sampled_from(MUST)), b=st.one_of(spellings, st.sampled_from(MUST)))
def test_two_numbers_share_a_key_exactly_when_javascript_cannot_tell_them_apart(
    node: RoundTrip, a: str, b: str
) -> None:
    """Values that are different doubles never match (no false "same turn"); values JavaScript
    folds into one always do."""
    same_in_js = node("[%s]" % a) == node("[%s]" % b)
    assert (key(model_call(a)) == key(model_call(b))) == same_in_js


@settings(max_examples=200, deadline=None)
@given(a=spellings, b=spellings)
def test_numbers_python_keeps_apart_that_javascript_folds_are_the_only_ones_folded(
    a: str, b: str
) -> None:
    """Python's round trip distinguishes at least as much as JavaScript's: whatever it keeps
    equal, the key keeps equal (Hermes' echo is never taken for a rewrite)."""
    if json.dumps(json.loads(a)) == json.dumps(json.loads(b)):
        assert key(model_call(a)) == key(model_call(b))


def test_claude_code_echo_of_tool_input_is_recognised(node: RoundTrip) -> None:
    """Anthropic Messages: the proxy streams `tool_input(call)` as JSON, the CLI sends back the
    parsed object in a `tool_use` block."""
    for spelling in MUST:
        call = model_call(spelling)
        if isinstance(call.arguments, str):
            continue  # not a JSON object the proxy can send as `input`
        echoed = node(orjson.dumps(tool_input(call)).decode())
        body = ('{"max_tokens": 10, "messages": [{"role": "assistant", "content": [{"type": '
                '"tool_use", "id": "toolu_1", "name": "bash", "input": %s}]}]}' % echoed)
        (message,) = parse_messages_request(orjson.loads(body)).messages  # as the wire parses
        assert key(message.tool_calls[0]) == key(call), spelling


def test_different_arguments_still_differ() -> None:
    base = {"command": "ls", "timeout": 1}
    variants = [{"command": "ls", "timeout": 2}, {"command": "ls", "timeout": "1"},
                {"command": "ls", "timeout": True}, {"command": "ls", "timeout": None},
                {"command": "ls"}, {"command": "ls", "timeout": [1]}, ["ls", 1],
                {"command": "ls ", "timeout": 1}, {"command": "ls", "timeout": 1.0000000000000002}]
    keys = {echo_key(v) for v in variants}
    assert len(keys) == len(variants) and echo_key(base) not in keys
    assert echo_key({"timeout": 1, "command": "ls"}) == echo_key(base)  # key order never counts


def test_a_deeply_nested_argument_has_a_key() -> None:
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    assert len(echo_key(deep)) == 16
    assert len(echo_key("[" * 5000 + "]" * 5000)) == 16


def test_js_number_is_the_double_javascript_holds() -> None:
    assert js_number(120000) == js_number(120000.0) == 120000.0
    assert js_number(2**53 + 1) == float(2**53)
    assert str(js_number(-0.0)) == "0.0"
    assert js_number(10**400) is None and js_number(float("inf")) is None
    assert js_number(float("nan")) is None
