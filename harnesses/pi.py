"""Pi (`@mariozechner/pi-coding-agent`): a minimal coding agent with 4 tools (read, bash, edit,
write), speaking OpenAI Chat Completions to a custom provider.

Measured with 0.73.1 (tests/test_harness_pi.py; request shapes in tests/fixtures/pi_requests.json):

- Pointed at us by `~/.pi/agent/models.json`: a provider with `baseUrl` (the OpenAI SDK appends
  `/chat/completions`, so it ends in `/v1`), `api: "openai-completions"`, `apiKey` (sent as
  `Authorization: Bearer`), and our model with `contextWindow`/`maxTokens`. The schema is
  `ModelsConfigSchema` in pi-coding-agent's `dist/core/model-registry.js`. A file that fails it
  is dropped silently: Pi then exits 1 with `Unknown provider "harness-gym"`.
- `apiKey` is resolved as: `!cmd` runs a shell command, else an environment variable of that
  name if one is set, else the literal. Session keys must therefore not start with `!`.
- Requests (OpenAI JS SDK 6.26, `X-Stainless-*` headers): only `POST /v1/chat/completions`, no
  probes; always `stream: true` with `stream_options.include_usage`, `store: false`,
  `max_completion_tokens`; 4 tools (read, bash, edit, write) with `strict: false`; the system
  prompt as a `system` message holding the date, the cwd and the install path; user content as
  a list of text parts; a tool-call turn echoed with `content: null` and compact re-serialized
  arguments; tool results as `role: "tool"` with string content ("(no output)" when empty).
- Failures: Pi exits 0 even when every model call failed; the error is in its events, which
  `parse_output` returns as `error`. The SDK retries a 429/5xx twice (`X-Stainless-Retry-Count`
  1, 2); a refused connection is retried by Pi itself for ~20 s.
- Offline: `--offline`/`PI_OFFLINE=1` skips the version check, package updates and the
  download of fd/rg; `PI_TELEMETRY=0` turns off install telemetry. Under strace it connects to
  nothing but the base URL, and it runs unchanged in a network namespace with only loopback.
- Each bash tool call runs in a new session (`detached`), outside Pi's process group; the
  sandbox's job marker is what kills it when the episode times out.
- `--mode json` prints one JSON event per line; stdout may also carry plain lines (offline
  notices), so the parser skips what is not JSON.
- The prompt (`cli/args.js`, `main.js`): a positional argument is taken verbatim unless it
  starts with "-" (a flag) or "@" (a file to attach); piped stdin is trimmed, then joined with
  the first positional message (`stdin + message`, no separator). A prompt therefore goes on
  stdin up to its last non-space character, its trailing whitespace as the positional message
  (so no prompt meets the 128 KiB argument limit); one starting with whitespace is a safe
  argument. `--no-prompt-templates` keeps a prompt starting
  with "/" from being expanded as a template.
- Limits: `contextWindow`/`maxTokens` in models.json; it sends `max_completion_tokens =
  maxTokens`. It compacts when the context passes `contextWindow - compaction.reserveTokens`
  (settings.json; default 16,384, which against SmolLM2's 8,192 compacted at the end of every
  episode) and keeps `compaction.keepRecentTokens` (default 20,000) unsummarized. We reserve the
  output cap and keep a quarter of the window. Its first request is 1,540 tokens with SmolLM2's
  tokenizer (1,757 with tiny's).
"""

from __future__ import annotations

import json

from ..harness import Endpoint, HarnessOutput, HarnessSpec, Package, json_events, tail

PROVIDER = "harness-gym"


class PiHarness(HarnessSpec):
    name = "pi"
    package = Package("npm", "@mariozechner/pi-coding-agent", "0.73.1", bin="pi")
    dialect = "openai-chat"
    shell_tool = "bash"
    env = {"PI_OFFLINE": "1", "PI_TELEMETRY": "0"}
    min_context = 8_192  # (first request 1,540 + 4,096) * 4/3, to a multiple of 1,024

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        message = _split(prompt)[1]
        return [
            "-p", "--offline", "--no-session", "--no-prompt-templates",
            "--provider", PROVIDER, "--model", endpoint.model,
            "--mode", "json",
            *([message] if message is not None else []),
        ]

    def stdin(self, prompt: str) -> str | None:
        return _split(prompt)[0]

    def config_files(self, endpoint: Endpoint) -> dict[str, str]:
        if endpoint.api_key.startswith("!"):
            raise ValueError("Pi runs an apiKey starting with '!' as a shell command")
        models = {
            "providers": {
                PROVIDER: {
                    "baseUrl": endpoint.base_url.rstrip("/") + "/v1",
                    "api": "openai-completions",
                    "apiKey": endpoint.api_key,
                    "models": [
                        {
                            "id": endpoint.model,
                            "name": endpoint.model,
                            "reasoning": False,
                            "input": ["text"],
                            "contextWindow": endpoint.context_length,
                            "maxTokens": endpoint.max_tokens,
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                        }
                    ],
                }
            }
        }
        settings = {
            "compaction": {
                "reserveTokens": endpoint.max_tokens,
                "keepRecentTokens": endpoint.context_length // 4,
            }
        }
        return {
            ".pi/agent/models.json": json.dumps(models, indent=2),
            ".pi/agent/settings.json": json.dumps(settings, indent=2),
        }

    def parse_output(self, stdout: str) -> HarnessOutput:
        final: str | None = None
        error: str | None = None
        n_tool_calls: int | None = None
        for event in json_events(stdout):
            kind = event.get("type")
            if kind == "tool_execution_start":
                n_tool_calls = (n_tool_calls or 0) + 1
            elif kind == "agent_start" and n_tool_calls is None:
                n_tool_calls = 0
            elif kind == "message_end":
                message = event.get("message") or {}
                if message.get("role") != "assistant":
                    continue
                if message.get("stopReason") in ("error", "aborted"):
                    error = message.get("errorMessage") or message.get("stopReason")
                text = "".join(
                    part.get("text", "")
                    for part in message.get("content") or []
                    if isinstance(part, dict) and part.get("type") == "text"
                )
                if text:
                    final = text
        return HarnessOutput(final, n_tool_calls, tail(stdout), error)


# What JavaScript's String.prototype.trim() removes (not quite Python's str.isspace()).
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008" \
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def _split(prompt: str) -> tuple[str | None, str | None]:
    """(stdin, positional message) that Pi joins back into exactly `prompt`. Stdin carries all
    it can (no 128 KiB argument limit, no flag or file parsing): everything but trailing
    whitespace, which Pi would trim off it. A prompt that starts with whitespace cannot start on
    stdin, and is safe as an argument."""
    if not prompt or prompt[0] in _JS_SPACE:
        return None, prompt
    body = prompt.rstrip(_JS_SPACE)
    return body, (prompt[len(body):] or None)
