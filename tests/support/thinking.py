"""A Qwen3-style thinking chat template for the tiny model, and scripted thinking policies.

The template follows Qwen3's own (ChatML, Hermes tool calls, `<think>` blocks): an assistant
turn's `reasoning_content` is rendered only for turns after the last user query, and the last
turn always gets a (maybe empty) `<think></think>`; earlier reasoning is dropped from the
rendered history. `opened=True` makes the generation prompt end with `<think>\\n` (as
Qwen3-Thinking-2507 and DeepSeek-R1 do), so everything sampled starts as reasoning.
"""

from __future__ import annotations

from collections.abc import Callable

from harness_gym.engines.tiny import load_tiny_tokenizer

_QWEN3_STYLE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == 'user' and message.content is string and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if loop.first and content or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
            {{- '<tool_call>\n{"name": ' + (call.name | tojson) + ', "arguments": ' }}
            {%- if call.arguments is string %}
                {{- call.arguments }}
            {%- else %}
                {{- call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if OPENED %}
        {{- '<think>\n' }}
    {%- elif enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""


def qwen3_style_template(*, opened: bool = False) -> str:
    return _QWEN3_STYLE.replace("OPENED", "true" if opened else "false").strip()


def thinking_tokenizer(*, opened: bool = False):
    """The tiny tokenizer (same ids as the tiny engine's) under the Qwen3-style template."""
    tokenizer = load_tiny_tokenizer()
    tokenizer.chat_template = qwen3_style_template(opened=opened)
    return tokenizer


def thinking(script: Callable[[str], str], thought: Callable[[int], str]) -> Callable[[str], str]:
    """`script`'s answers, each after a `<think>` block: `thought(n)` on the n-th tool turn."""

    def answer(prompt_text: str) -> str:
        step = prompt_text.count("<tool_response>")
        return f"<think>\n{thought(step)}\n</think>\n\n{script(prompt_text)}"

    return answer
