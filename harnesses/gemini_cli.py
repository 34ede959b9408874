"""Gemini CLI (`@google/gemini-cli`): Google's coding agent, speaking the Gemini API
(`generateContent` / `streamGenerateContent`) to `GOOGLE_GEMINI_BASE_URL`.

Measured with 0.61.0 (tests/test_harness_gemini_cli.py):

- The npm install is ~100 MB and takes ~20 s.
- Pointed at us by `GOOGLE_GEMINI_BASE_URL` (the server root: its SDK adds `/v1beta/models/...`)
  and `GEMINI_API_KEY` (sent as `x-goog-api-key`); `security.auth.selectedType =
  "gemini-api-key"` in `~/.gemini/settings.json` (else "Invalid auth method selected", exit
  41) and `GEMINI_CLI_TRUST_WORKSPACE=true` (else it exits 55 in an untrusted folder).
- Requests: with `-m MODEL` it sends only `POST /v1beta/models/MODEL:streamGenerateContent
  ?alt=sse` (without it, a `generateContent` routing call to a flash-lite model first). ~38 KB:
  a ~30 KB `systemInstruction`, the session context and the task as two text parts of the
  first user turn, `generationConfig` with temperature 1, topP 0.95, topK 64 and a
  thinkingConfig.
- Offline: under strace it connects to nothing but the base URL with telemetry and usage
  statistics off and auto-update off (the settings below); `GEMINI_CLI_NO_RELAUNCH` keeps it
  from re-spawning node with a larger heap (one process, in our process group).
- Tools: without approval (`-p` or piped input) it leaves out every tool that needs one
  (`run_shell_command`, `write_file`, `replace`); `--approval-mode yolo` offers them.
- Limits: its context window is a table of Google's models (1,048,576 tokens for any other
  name) and cannot be set; compression starts at `model.compressionThreshold` times that, so
  the threshold is set to 3/4 of our window over 1,048,576. The output cap goes in as
  `maxOutputTokens` through `modelConfigs.customOverrides` for our model.
- The prompt: piped stdin, read whole (up to 8 MiB) and not trimmed, is the prompt when there
  is no `-p`.
- `-o json` prints one JSON object at the end: `response` (the final text), `stats.tools.
  totalCalls`, or `error.message` (exit 1).
"""

from __future__ import annotations

import json
from typing import Any

from ..harness import Endpoint, HarnessOutput, HarnessSpec, Package, tail

MODEL_TOKEN_LIMIT = 1_048_576  # what Gemini CLI assumes for a model it does not know


class GeminiCliHarness(HarnessSpec):
    name = "gemini-cli"
    package = Package("npm", "@google/gemini-cli", "0.61.0", bin="gemini")
    dialect = "gemini"
    shell_tool = "run_shell_command"
    # (first request, 15,449 tokens with tiny's tokenizer, task included, + 4,096) * 4/3,
    # to a multiple of 1,024; at it the CLI neither compacts nor continues (test_harness_limits)
    min_context = 26_624
    env = {"GEMINI_CLI_TRUST_WORKSPACE": "true", "GEMINI_CLI_NO_RELAUNCH": "true",
           "GEMINI_SANDBOX": "false", "NO_COLOR": "1"}

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return ["-m", endpoint.model, "--approval-mode", "yolo", "-o", "json"]

    def stdin(self, prompt: str) -> str | None:
        return prompt

    def config_files(self, endpoint: Endpoint) -> dict[str, str]:
        settings: dict[str, Any] = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "model": {"compressionThreshold": round(
                endpoint.context_length * 3 / 4 / MODEL_TOKEN_LIMIT, 6)},
            "modelConfigs": {"customOverrides": [{
                "match": {"model": endpoint.model},
                "modelConfig": {"generateContentConfig": {
                    "maxOutputTokens": endpoint.max_tokens}},
            }]},
        }
        return {".gemini/settings.json": json.dumps(settings, indent=2)}

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": endpoint.base_url.rstrip("/"),
                "GEMINI_API_KEY": endpoint.api_key}

    def parse_output(self, stdout: str) -> HarnessOutput:
        start = stdout.find("{")
        try:
            report = json.loads(stdout[start:]) if start >= 0 else {}
        except ValueError:
            report = {}
        if not isinstance(report, dict):
            report = {}
        error = report.get("error")
        calls = ((report.get("stats") or {}).get("tools") or {}).get("totalCalls")
        return HarnessOutput(
            report.get("response") or None,
            calls if isinstance(calls, int) else None,
            tail(stdout),
            str(error.get("message") or error) if isinstance(error, dict) else None,
        )
