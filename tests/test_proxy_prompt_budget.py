"""Prompt work is bounded by a token budget, not by what a client sends (issue 11 item 6).

Long texts are tokenized piece by piece (split after the end-of-turn token, which the tokenizer
splits at by itself) and must give exactly the ids of one whole call; a text clearly over the
budget stops after about the budget's worth of tokenizing, before it is even rendered when the
messages alone are over; truncation finds the fewest tool results to blank by bisection.
"""

from __future__ import annotations

import pytest

from harness_gym.engines.tiny import load_tiny_tokenizer
from harness_gym.proxy.bridge import TRUNCATED_TOOL_RESULT, PromptBridge
from harness_gym.proxy.canonical import ChatRequest, Message
from harness_gym.proxy.rendering import PromptRenderer, PromptTooLong
from harness_gym.trace import SessionTrace

LINE = "def f(x):\n    return x + 1  # çé 中文, a line as agents send them\n"


@pytest.fixture(scope="module")
def renderer() -> PromptRenderer:
    tokenizer = load_tiny_tokenizer()
    return PromptRenderer(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")])


class CountingEncoder:
    """Wraps the renderer's encoder to count how many characters it was given."""

    def __init__(self, renderer: PromptRenderer) -> None:
        self.inner, self.chars = renderer._encode, 0
        renderer._encode = self

    def __call__(self, text: str) -> list[int]:
        self.chars += len(text)
        return self.inner(text)


def conversation(turns: int, text: str) -> list[Message]:
    messages = [Message("system", "You are a coding agent.")]
    for i in range(turns):
        messages += [Message("user", f"{i}: {text}"), Message("assistant", f"ok {i}\n\n  ")]
    return messages


def test_a_long_prompt_encodes_piece_by_piece_to_exactly_the_ids_of_one_call(renderer):
    text = renderer.render_text([m.template_dict() for m in conversation(40, LINE * 30)])
    whole = renderer.tokenizer.encode(text, add_special_tokens=False)
    # A budget just above the count takes the piece-by-piece path and must change nothing.
    assert 4 * len(text) > len(whole) + 1
    assert renderer.encode(text, budget=len(whole) + 1) == whole
    with pytest.raises(PromptTooLong) as too_long:
        renderer.encode(text, budget=len(whole) // 2)
    assert too_long.value.prompt_tokens > len(whole) // 2


def test_a_text_far_over_the_budget_costs_about_the_budget_to_refuse(renderer):
    budget = 4000
    counter = CountingEncoder(renderer)
    try:
        with pytest.raises(PromptTooLong) as too_long:
            renderer.encode(LINE * 100_000, budget=budget)  # ~7 MB, one piece
    finally:
        renderer._encode = counter.inner
    assert too_long.value.prompt_tokens > budget
    # Counted 32K characters at a time until clearly over: a few windows are plenty here.
    assert counter.chars <= 4 * 32 * 1024


def test_messages_clearly_over_the_budget_are_refused_before_rendering(renderer, monkeypatch):
    def no_rendering(*args, **kwargs):
        raise AssertionError("rendered a prompt that was clearly too long")

    monkeypatch.setattr(renderer, "render_text", no_rendering)
    with pytest.raises(PromptTooLong):
        renderer.render_full(conversation(200, LINE * 40), (), budget=5000)


def test_a_prompt_within_the_budget_renders_as_before(renderer):
    messages = conversation(3, LINE)
    expected = renderer.render_full(messages, ())
    assert renderer.render_full(messages, (), budget=len(expected)) == expected


def test_truncation_blanks_the_fewest_oldest_tool_results_that_make_it_fit(renderer):
    messages = [Message("system", "You are a coding agent."), Message("user", "Fix it.")]
    for i in range(12):
        messages += [Message("assistant", f"step {i}"),
                     Message("tool", f"output {i} " + LINE * (3 + i % 4), tool_call_id=f"c{i}")]
    request = ChatRequest(tuple(messages))
    full = len(renderer.render_full(request.messages, ()))
    tool_positions = [i for i, m in enumerate(messages) if m.role == "tool"]

    def blanked(k: int) -> int:
        cut = list(messages)
        for index in tool_positions[:k]:
            cut[index] = Message("tool", TRUNCATED_TOOL_RESULT, tool_call_id=cut[index].tool_call_id)
        return len(renderer.render_full(cut, ()))

    for low_water in (full - 1, full * 2 // 3, full // 3):
        bridge = PromptBridge(renderer, SessionTrace())
        plan = bridge.plan_truncated(request, lambda n: n <= low_water)
        fewest = next(k for k in range(1, 13) if blanked(k) <= low_water)  # one by one
        assert plan.truncated_tool_results == fewest
        assert len(plan.prompt_ids) == blanked(fewest) and plan.kind == "new"
