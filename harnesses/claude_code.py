"""Claude Code (`@anthropic-ai/claude-code`): Anthropic's coding agent, speaking Anthropic
Messages (always streaming) to `ANTHROPIC_BASE_URL`.

Measured with 2.1.328 (tests/test_harness_claude_code.py; one request pair in
tests/fixtures/claude_code_requests.json):

- Installs in ~5 s (357 MB: per-platform native binaries).
- Pointed at us by the environment: `ANTHROPIC_BASE_URL` (the server root; the SDK appends
  `/v1/messages`), `ANTHROPIC_API_KEY` (sent as `x-api-key`), `ANTHROPIC_MODEL` and
  `ANTHROPIC_DEFAULT_HAIKU_MODEL` (else background calls name a Haiku model we do not serve).
  An unknown model name only logs `[claude-code:unrecognized_model]` on stderr.
  `CLAUDE_CODE_MAX_OUTPUT_TOKENS` sets `max_tokens` (default 32000).
- Requests (`User-Agent: claude-cli/2.1.328 (external, sdk-cli)`, Anthropic JS SDK 0.128,
  `anthropic-version: 2023-06-01`, an `anthropic-beta` list of 8 betas,
  `X-Claude-Code-Session-Id`): only `POST /v1/messages?beta=true`, no probes seen in this
  version; `stream: true`, `thinking: {"type": "adaptive", ...}`, `context_management`,
  `output_config`, `metadata.user_id` (a JSON string); `system` as 3 text blocks (two with
  `cache_control`); ~49 KB with 12 tools (Bash, Read, Edit, Write, Agent, ...). The user turn
  holds 2 text blocks (a `<system-reminder>` and the prompt), followed by a `role: "system"`
  message inside `messages`; the tool call is echoed as a parsed `tool_use` block and its
  result is a `tool_result` block with `cache_control` ("(Bash completed with no output)").
- Offline: `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` (no telemetry, update checks, or
  feedback surveys); under strace it connects to nothing but the base URL. As root it refuses
  `--dangerously-skip-permissions` unless `IS_SANDBOX=1`, which is harmless for other users.
- `--output-format stream-json --verbose` prints one JSON event a line: `system` (init),
  `assistant`/`user` messages, and a final `result` with `result`, `num_turns`, `is_error`.
- The prompt goes on stdin (`-p` with no prompt argument reads it, exactly: leading dashes,
  trailing spaces, 20 KB measured), so no argument parsing touches it and the 128 KiB argument
  limit does not apply. A prompt whose first word is one of Claude Code's own slash commands
  (`/compact ...`) still runs that command, on stdin, after `--`, or as stream-json input, and
  with `--disable-slash-commands` ("/compact isn't available"); `/usr/bin/...` is plain text.
- Limits: for a model it does not know ("policy") it assumes a 1,000,000-token window
  (`modelUsage.contextWindow` in the result); `CLAUDE_CODE_MAX_CONTEXT_TOKENS` sets the window
  and `CLAUDE_CODE_MAX_OUTPUT_TOKENS` each request's `max_tokens`. It auto-compacts once the
  conversation passes about `window - max_output - 13,000` tokens (measured through the proxy
  with SmolLM2's tokenizer: window 26,624 and output 6,656 -> it compacted after its second call,
  at 12.5k; window 32,768 and output 4,096 -> at 16-17k, and since its first request alone is
  12.4k it then compacted again every two or three calls, 960 times in 10 minutes). With a
  quarter of the window for the answer and ~4k for a few turns, it needs
  (12,424 + 4,096 + 13,000) * 4/3 ≈ 39k; against SmolLM2's 8,192 it cannot start.
"""

from __future__ import annotations

from typing import Any

from ..harness import Endpoint, HarnessOutput, HarnessSpec, Package, json_events, tail


class ClaudeCodeHarness(HarnessSpec):
    name = "claude-code"
    package = Package("npm", "@anthropic-ai/claude-code", "2.1.328", bin="claude")
    dialect = "anthropic-messages"
    shell_tool = "Bash"
    env = {
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "IS_SANDBOX": "1",
    }
    min_context = 39_936  # (first request 12,424 + 4,096 + 13,000) * 4/3, to a multiple of 1,024

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return [
            "-p",
            "--output-format", "stream-json", "--verbose",
            "--dangerously-skip-permissions",
        ]

    def stdin(self, prompt: str) -> str:
        return prompt

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": endpoint.base_url.rstrip("/"),
            "ANTHROPIC_API_KEY": endpoint.api_key,
            "ANTHROPIC_MODEL": endpoint.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.model,
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(endpoint.max_tokens),
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(endpoint.context_length),
        }

    def parse_output(self, stdout: str) -> HarnessOutput:
        final: str | None = None
        error: str | None = None
        n_tool_calls: int | None = None
        for event in json_events(stdout):
            kind = event.get("type")
            if kind == "system" and event.get("subtype") == "init":
                n_tool_calls = n_tool_calls or 0
            elif kind == "assistant":
                n_tool_calls = (n_tool_calls or 0) + sum(
                    1 for block in _content(event) if block.get("type") == "tool_use"
                )
            elif kind == "result":
                final = event.get("result") or None
                if event.get("is_error"):
                    error = final or event.get("subtype") or "error"
                    final = None
        return HarnessOutput(final, n_tool_calls, tail(stdout), error)


def _content(event: dict[str, Any]) -> list[dict[str, Any]]:
    content = (event.get("message") or {}).get("content")
    return [block for block in content or [] if isinstance(block, dict)]
