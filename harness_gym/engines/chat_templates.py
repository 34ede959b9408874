"""ChatML chat templates with a Hermes/Qwen-style tool section, for the built-in engines.

Both built-in models speak ChatML (`<|im_start|>role\n...<|im_end|>\n`). Tools are listed as JSON
inside `<tools></tools>` in the system turn; the model calls one with
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; tool results go back in one user
turn, each inside `<tool_response></tool_response>` (Qwen2.5's layout, which the Hermes tool-call
parser in the proxy reads). Every tag strips the whitespace around it and newlines are emitted
explicitly with `{{- '\n' }}`: transformers renders templates with `trim_blocks`, so a literal
newline in the template source would silently vanish or appear depending on where it sits.
"""

from __future__ import annotations

import json

_RENDER_CONTENT = r"""
{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for part in content %}
            {%- if part is string %}
                {{- part }}
            {%- elif part.text is defined %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is not none %}
        {{- content | string }}
    {%- endif %}
{%- endmacro %}
"""

_SYSTEM_OPEN = r"""
{%- set has_system = messages and messages[0].role == 'system' %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if has_system %}
        {{- render_content(messages[0].content) + '\n\n' }}
    {%- elif default_system %}
        {{- default_system + '\n\n' }}
    {%- endif %}
"""

_SYSTEM_CLOSE = r"""
    {{- '<|im_end|>\n' }}
{%- elif has_system %}
    {{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' }}
{%- elif default_system %}
    {{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' }}
{%- endif %}
"""

_TOOL_INSTRUCTIONS = r"""
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
"""

# A small instruct model never calls a tool zero-shot (SmolLM2-135M: 0 of 16 samples); one worked
# example in the system turn gets it to emit well-formed calls. The example uses the harness's
# shell tool (any tool with a `command` parameter: Bash, bash, terminal) when there is one.
_TOOL_EXAMPLE = r"""
    {%- set example = namespace(shell=none) %}
    {%- for tool in tools %}
        {%- set fn = tool.function if tool.function is defined else tool %}
        {%- if example.shell is none and fn.parameters is defined and fn.parameters.properties is defined and 'command' in fn.parameters.properties %}
            {%- set example.shell = fn.name %}
        {%- endif %}
    {%- endfor %}
    {{- '\n\nFor example, ' }}
    {%- if example.shell is not none %}
        {{- 'to list the files in the working directory, answer:\n<tool_call>\n{"name": ' }}
        {{- (example.shell | tojson) + ', "arguments": {"command": "ls"}}\n</tool_call>' }}
    {%- else %}
        {%- set fn = tools[0].function if tools[0].function is defined else tools[0] %}
        {{- 'to call ' + fn.name + ', answer:\n<tool_call>\n{"name": ' + (fn.name | tojson) }}
        {{- ', "arguments": {' }}
        {%- set required = fn.parameters.required if fn.parameters is defined and fn.parameters.required is defined else [] %}
        {%- for name in required %}
            {{- (name | tojson) + ': "..."' }}
            {%- if not loop.last %}
                {{- ', ' }}
            {%- endif %}
        {%- endfor %}
        {{- '}}\n</tool_call>' }}
    {%- endif %}
"""

_MESSAGES = r"""
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- set text = render_content(message.content) %}
        {%- if message.tool_calls %}
            {%- if text %}
                {{- '\n' + text }}
            {%- endif %}
            {%- for tool_call in message.tool_calls %}
                {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
                {{- '\n<tool_call>\n{"name": ' + (call.name | tojson) + ', "arguments": ' }}
                {%- if call.arguments is string %}
                    {{- call.arguments }}
                {%- else %}
                    {{- call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- else %}
            {{- '\n' + text }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def chatml_tool_template(*, default_system: str | None = None, tool_example: bool = False) -> str:
    """A ChatML template with a tool section.

    `default_system` is the system prompt used when the conversation has none (a model trained
    with one, like SmolLM2, behaves worse without it); `tool_example` adds a one-shot tool call.
    """
    # A JSON string literal is a valid Jinja string literal.
    default = json.dumps(default_system, ensure_ascii=False) if default_system else "none"
    return "".join(
        [
            _RENDER_CONTENT,
            "{%- set default_system = " + default + " %}",
            _SYSTEM_OPEN,
            _TOOL_INSTRUCTIONS,
            _TOOL_EXAMPLE if tool_example else "",
            _SYSTEM_CLOSE,
            _MESSAGES,
        ]
    ).strip()


# The tiny model was never trained, so it gets no default system prompt.
QWEN_TOOL_TEMPLATE = chatml_tool_template()

SMOLLM2_TOOL_TEMPLATE = chatml_tool_template(
    default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    tool_example=True,
)
