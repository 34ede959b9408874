"""Qwen Code (`@qwen-code/qwen-code`): Alibaba's fork of Gemini CLI, speaking OpenAI Chat
Completions to `OPENAI_BASE_URL`.

Measured with 0.24.4 (tests/test_harness_more_clis.py):

- The npm install is ~144 MB and takes ~11 s.
- Pointed at us by `OPENAI_BASE_URL` (ends in `/v1`), `OPENAI_API_KEY` (sent as `Authorization:
  Bearer`), `OPENAI_MODEL`, with `security.auth.selectedType = "openai"` in
  `~/.qwen/settings.json`. It sends only `POST /v1/chat/completions`: streaming with
  `stream_options.include_usage`, a ~27 KB system message, the session context and the task as
  one user message, 14 tools (`run_shell_command`, `read_file`, `edit`, `write_file`, ...).
- Offline: under strace it connects to nothing but the base URL with telemetry, usage
  statistics and auto-update off (the settings below). Its vendored ripgrep is installed
  without its exec bit (EACCES): it falls back to its built-in grep, and says so on stderr.
- Tools: `--approval-mode yolo` offers the tools that need approval (without it a headless run
  has no shell); `QWEN_CODE_SUPPRESS_YOLO_WARNING=1` keeps the notice about it off stderr.
- Limits: `model.generationConfig.contextWindowSize` and `samplingParams.max_tokens` (each
  request's `max_tokens`; without it, 32,000).
- The prompt: piped stdin, whole, as in Gemini CLI.
- `-o stream-json` prints Claude Code's event stream (`system` init, `assistant` messages with
  `tool_use` blocks, a final `result`), so Claude Code's parser reads it.
"""

from __future__ import annotations

import json

from ..harness import Endpoint, HarnessOutput, HarnessSpec, Package, json_events
from .claude_code import ClaudeCodeHarness


class QwenCodeHarness(HarnessSpec):
    name = "qwen-code"
    package = Package("npm", "@qwen-code/qwen-code", "0.24.4", bin="qwen")
    dialect = "openai-chat"
    shell_tool = "run_shell_command"
    env = {"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1", "NO_COLOR": "1"}

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return ["-m", endpoint.model, "--approval-mode", "yolo", "-o", "stream-json"]

    def stdin(self, prompt: str) -> str | None:
        return prompt

    def config_files(self, endpoint: Endpoint) -> dict[str, str]:
        settings = {
            "security": {"auth": {"selectedType": "openai"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "model": {"name": endpoint.model, "generationConfig": {
                "contextWindowSize": endpoint.context_length,
                "samplingParams": {"max_tokens": endpoint.max_tokens},
            }},
        }
        return {".qwen/settings.json": json.dumps(settings, indent=2)}

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        return {"OPENAI_BASE_URL": endpoint.base_url.rstrip("/") + "/v1",
                "OPENAI_API_KEY": endpoint.api_key, "OPENAI_MODEL": endpoint.model}

    def parse_output(self, stdout: str) -> HarnessOutput:
        output = ClaudeCodeHarness().parse_output(stdout)
        if output.error is not None:  # Qwen Code says why in the result's `error`
            said = [e["error"]["message"] for e in json_events(stdout) if e.get("type") ==
                    "result" and isinstance(e.get("error"), dict) and e["error"].get("message")]
            output.error = said[-1] if said else output.error
        return output
