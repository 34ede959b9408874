"""Images in user messages and tool results never end an episode with a 400.

A text-only policy (tiny) is shown a recorded placeholder, through each official SDK over real
HTTP: the trace's prompt ids hold exactly the text the model saw, and the conversation stays one
segment. A multimodal engine's template gets the image parts (checked at the rendering level: no
multimodal engine runs here).
"""

from __future__ import annotations

import base64
import hashlib

import pytest
from support.dialect_clients import DialectClient
from support.engines import RecordingEngine, tool_call_script
from test_proxy_openai_chat import assert_segment_is_what_the_engine_sampled

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.proxy import InterceptionProxy
from harness_gym.proxy.anthropic_messages import parse_messages_request
from harness_gym.proxy.canonical import Message
from harness_gym.proxy.rendering import PromptRenderer

# A real 1x1 PNG.
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
       "RU5ErkJggg==")
SCREENSHOT = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8).decode()
DIALECTS = ["anthropic", "chat", "responses"]


def digest(data: str) -> str:
    return hashlib.sha256(data.encode()).hexdigest()[:12]


def user_with_image(dialect: str, text: str, data: str) -> dict:
    if dialect == "anthropic":
        return {"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": data}}]}
    if dialect == "chat":
        return {"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}
    return {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": text},
        {"type": "input_image", "image_url": f"data:image/png;base64,{data}", "detail": "auto"}]}


def image_result(dialect: str, call_id: str, data: str) -> dict:
    """A tool result that is an image, as Claude Code's `Read` of a PNG sends it."""
    if dialect == "anthropic":
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                             "content": [{"type": "image", "source": {
                                                 "type": "base64", "media_type": "image/png",
                                                 "data": data}}]}]}
    if dialect == "chat":
        return {"role": "tool", "tool_call_id": call_id, "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}
    return {"type": "function_call_output", "call_id": call_id, "output": [
        {"type": "input_image", "image_url": f"data:image/png;base64,{data}"}]}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_text_only_policy_sees_a_recorded_placeholder_for_each_image(tiny, dialect, stream):
    engine = RecordingEngine(ScriptedEngine(tiny, tool_call_script(turns=2)))
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session()
        client = DialectClient.open(dialect, proxy, session, ["bash"])
        client.history.append(user_with_image(dialect, "What is in this screenshot?", SCREENSHOT))
        answer = client.ask(stream=stream)
        [(call_id, _, _)] = answer.calls
        client.echo(answer, [])
        client.history.append(image_result(dialect, call_id, PNG))
        final = client.ask(stream=stream)
        assert final.text == "All done."

        [segment] = session.trace_json()["segments"]  # the images did not break the bridge
        assert_segment_is_what_the_engine_sampled(segment, engine.calls, tiny)
        seen = tiny.tokenizer.decode(segment["prompt_ids"] + segment["response_ids"])
        assert (f"What is in this screenshot?[image omitted: image/png, 2.0 KB, sha256 "
                f"{digest(SCREENSHOT)}; this model reads text only]") in seen
        assert (f"<tool_response>\n[image omitted: image/png, 70 B, sha256 {digest(PNG)}; "
                "this model reads text only]\n</tool_response>") in seen
        assert SCREENSHOT[:40] not in seen and PNG[:40] not in seen


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_changed_image_in_the_history_is_a_changed_history(tiny, dialect):
    engine = RecordingEngine(ScriptedEngine(tiny, tool_call_script(turns=3)))
    with InterceptionProxy(engine) as proxy:
        session = proxy.open_session()
        client = DialectClient.open(dialect, proxy, session, ["bash"])
        client.history.append(user_with_image(dialect, "Look.", PNG))
        answer = client.ask()
        client.echo(answer, ["ok"])
        client.history[0] = user_with_image(dialect, "Look.", SCREENSHOT)
        client.ask()
        assert len(session.trace_json()["segments"]) == 2


VISION_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for part in message.content %}"
    "{%- if part.type == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- else %}{{- part.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture()
def vision_tokenizer(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.tokenizer.name_or_path)
    tokenizer.chat_template = VISION_TEMPLATE
    return tokenizer


def claude_code_read_of_a_png() -> list[Message]:
    body = {"model": "policy", "max_tokens": 64, "messages": [
        {"role": "user", "content": "Read shot.png"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "shot.png"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": PNG}}]},
            {"type": "text", "text": "Describe it."}]}]}
    return list(parse_messages_request(body).messages)


def test_a_multimodal_template_is_given_the_image_parts(vision_tokenizer):
    im_end = vision_tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages = claude_code_read_of_a_png()
    rendered = {}
    for multimodal in (False, True):
        renderer = PromptRenderer(vision_tokenizer, [im_end], multimodal=multimodal)
        rendered[multimodal] = vision_tokenizer.decode(renderer.render_full(messages, []))
    assert "<|vision_start|><|image_pad|><|vision_end|>" in rendered[True]
    assert "image omitted" not in rendered[True]
    assert f"[image omitted: image/png, 70 B, sha256 {digest(PNG)}" in rendered[False]
    assert "<|image_pad|>" not in rendered[False]
    # The template is handed the image itself, as a data URL.
    [part] = [p for p in messages[2].template_dict(multimodal=True)["content"]
              if p["type"] == "image"]
    assert part["image"] == f"data:image/png;base64,{PNG}"


def test_the_bridge_renders_new_image_messages_for_a_multimodal_template(vision_tokenizer):
    im_end = vision_tokenizer.convert_tokens_to_ids("<|im_end|>")
    renderer = PromptRenderer(vision_tokenizer, [im_end], multimodal=True)
    messages = claude_code_read_of_a_png()
    ids = renderer.render_after(messages[1], messages[2:], turn_closed=True)
    text = vision_tokenizer.decode(ids)
    assert text.count("<|image_pad|>") == 1 and text.endswith("<|im_start|>assistant\n")
