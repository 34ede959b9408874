"""OpenCode (`opencode-ai`): a coding agent with 10 tools (bash, edit, glob, grep, read, skill,
task, todowrite, webfetch, write), speaking OpenAI Chat Completions through the AI SDK's
`@ai-sdk/openai-compatible` provider (bundled in its binary).

Measured with 1.18.33 (tests/test_harness_opencode.py; shapes in
tests/fixtures/opencode_requests.json):

- The npm package is a 185 MB Bun-compiled binary per platform (354 MB installed, ~11 s).
- Pointed at us by `~/.config/opencode/opencode.json`: a provider with
  `npm: "@ai-sdk/openai-compatible"`, `options.baseURL` (ends in `/v1`; the SDK appends
  `/chat/completions`), `options.apiKey` (sent as `Authorization: Bearer`), our model with its
  `limit`, `model: "harness-gym/<model>"`, `permission: "allow"` (else a headless run asks and
  the question tool is denied).
- Requests (`User-Agent: opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14`,
  plus `x-session-id`/`x-session-affinity`): only `POST /v1/chat/completions`, no probes;
  always `stream: true` with `stream_options.include_usage`, `max_tokens`, `tool_choice: "auto"`;
  ~30 KB (10 tools); system prompt as a `system` message; user content a plain string; a
  tool-call turn echoed with `content: ""` and compact re-serialized arguments; tool results as
  `role: "tool"` with string content ("(no output)" when empty).
- `opencode run` builds its message as `args.map(a => a.includes(" ") ? `"${a.replace(/"/g,
  '\\"')}"` : a).join(" ")`, then appends piped stdin after a newline (`Bun.stdin.text()`), or
  takes stdin alone when there are no message arguments. Any argument holding a space arrives
  quoted and escaped, and one starting with "-" is a flag; so the prompt goes on stdin only,
  byte for byte (measured: leading dashes, quotes, backslashes, trailing spaces, non-ASCII).
  Without `--title` it makes an extra title-generation call.
- Limits: `limit.context`/`limit.output` of our model in the config. It compacts when a call's
  usage (prompt + answer) reaches `context - output` (`compaction.reserved` only applies with
  `limit.input`), and asks each call for `max_tokens = output`. Its first request is 7,757
  tokens with SmolLM2's tokenizer (9,102 with tiny's): with a quarter of the window reserved
  for the answer and ~4k left for a few turns, it needs a window of (7,757 + 4,096) * 4/3 ≈
  16k; in SmolLM2's 8,192 it compacted after every turn until the episode timed out.
- Offline: at start it installs `@opencode-ai/plugin` (its own version) into every config dir
  with an embedded npm, i.e. it calls registry.npmjs.org. We install the plugin beside the CLI
  in the cache and `prepare` links `~/.config/opencode/node_modules` to it, with a package.json
  naming it; then, under strace, it connects to nothing but the base URL.
  `OPENCODE_DISABLE_MODELS_FETCH` stops the models.dev fetch, `OPENCODE_DISABLE_AUTOUPDATE` the
  update check.
- `--format json` prints one JSON event a line: `step_start`, `tool_use` (one per finished tool
  call), `text`, `step_finish`, `error`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..harness import (
    Endpoint,
    HarnessOutput,
    HarnessSpec,
    LaunchPlan,
    Package,
    json_events,
    tail,
)
from ..sandbox.base import Sandbox

PROVIDER = "harness-gym"
VERSION = "1.18.33"
PLUGIN = "@opencode-ai/plugin"
CONFIG_DIR = ".config/opencode"


class OpenCodeHarness(HarnessSpec):
    name = "opencode"
    package = Package("npm", "opencode-ai", VERSION, bin="opencode",
                      extras=(f"{PLUGIN}@{VERSION}",))
    dialect = "openai-chat"
    shell_tool = "bash"
    env = {
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
    }
    min_context = 16_384  # (first request 7,757 + 4,096) * 4/3, to a multiple of 1,024

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return [
            "run", "--pure", "--format", "json", "--title", "harness-gym",
            "--model", f"{PROVIDER}/{endpoint.model}",
        ]

    def stdin(self, prompt: str) -> str:
        return prompt

    def config_files(self, endpoint: Endpoint) -> dict[str, str]:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": PROVIDER,
                    "options": {
                        "baseURL": endpoint.base_url.rstrip("/") + "/v1",
                        "apiKey": endpoint.api_key,
                    },
                    "models": {
                        endpoint.model: {
                            "name": endpoint.model,
                            "tool_call": True,
                            "limit": {"context": endpoint.context_length,
                                      "output": endpoint.max_tokens},
                        }
                    },
                }
            },
            "model": f"{PROVIDER}/{endpoint.model}",
            "permission": "allow",
            "autoupdate": False,
            "share": "disabled",
        }
        return {f"{CONFIG_DIR}/opencode.json": json.dumps(config, indent=2)}

    def prepare(
        self,
        sandbox: Sandbox,
        endpoint: Endpoint,
        prompt: str,
        cache_dir: Path | str | None = None,
    ) -> LaunchPlan:
        plan = super().prepare(sandbox, endpoint, prompt, cache_dir)
        # OpenCode installs nothing when the config dir's package.json and lockfile match its
        # node_modules: copy the cache's two small files, link its node_modules (it would be
        # 64 MB a copy). A package.json naming only the plugin was not enough: npm ran.
        prefix = self.install_dir(cache_dir)
        for name in ("package.json", "package-lock.json"):
            sandbox.write_file(f"{sandbox.home}/{CONFIG_DIR}/{name}", (prefix / name).read_bytes())
        modules = prefix / "node_modules"
        link = f"{sandbox.home}/{CONFIG_DIR}/node_modules"
        done = sandbox.exec(["ln", "-sfn", str(modules), link], timeout=30)
        if done.exit_code != 0:
            raise OSError(f"could not link {link} -> {modules}: {done.stderr}")
        return plan

    def parse_output(self, stdout: str) -> HarnessOutput:
        final: str | None = None
        error: str | None = None
        n_tool_calls: int | None = None
        for event in json_events(stdout):
            kind = event.get("type")
            part = event.get("part") or {}
            if n_tool_calls is None:
                n_tool_calls = 0
            if kind == "tool_use":
                n_tool_calls += 1
            elif kind == "text" and part.get("text") and not part.get("synthetic"):
                # A synthetic part is OpenCode's own user turn ("Continue if you have next
                # steps..." after a compaction), not what the model said.
                final = part["text"]
            elif kind == "error":
                error = _error_text(event.get("error"))
        return HarnessOutput(final, n_tool_calls, tail(stdout), error)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        data = error.get("data") or {}
        message = data.get("message") if isinstance(data, dict) else None
        return str(message or error.get("message") or error.get("name") or error)
    return str(error)

