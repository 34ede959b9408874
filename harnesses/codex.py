"""Codex CLI (`@openai/codex`): OpenAI's coding agent (a Rust binary in an npm wrapper), speaking
OpenAI Responses to a custom model provider.

Measured with 0.169.0 (tests/test_harness_codex.py):

- The npm install is ~404 MB (348 MB of it the musl binary, 51 MB bundled voice resources) and
  takes ~20 s.
- Pointed at us by `~/.codex/config.toml`: `model_provider` naming a `[model_providers.X]` with
  `base_url` (ends in `/v1`), `env_key` (the variable holding the key, sent as `Authorization:
  Bearer`) and `wire_api = "responses"`. It sends only `POST /v1/responses`: streaming, `store:
  false`, `reasoning.encrypted_content` included, two `developer` messages (~20 KB) and an
  environment-context user message before the task.
- Offline: left to its defaults it resolves github.com and api.github.com at start (the release
  check and the plugin / skill sync). `check_for_update_on_startup = false` and the `[features]`
  below off (plugins, apps, model discovery, dependency installs, updates, the daemon) leave it
  connecting to nothing but the base URL (strace); `analytics.enabled = false`.
- Tools: with `unified_exec` (the default) the shell tool is `exec_command`, its command in
  `cmd` (a string). Codex sandboxes commands itself (landlock/seccomp, read-only by default):
  inside our sandbox that is off (`--dangerously-bypass-approvals-and-sandbox`), the episode's
  sandbox is the boundary.
- Limits: `model_context_window` and `model_auto_compact_token_limit` (compaction at 3/4 of the
  window). It has no output cap setting (`model_max_output_tokens` is "ignored", it says) and
  sends no `max_output_tokens`: the proxy's session cap is the only one.
- The prompt: `exec -` reads it from stdin, whole.
- `--json` prints JSON-lines events: `item.completed` with `agent_message` (text) and
  `command_execution` items, `turn.failed` / `error` with a message. A failed turn exits 1.
"""

from __future__ import annotations

import json

from ..harness import Endpoint, HarnessOutput, HarnessSpec, Package, json_events, tail

PROVIDER = "harness-gym"
KEY_VARIABLE = "HARNESS_GYM_API_KEY"
# Features that reach the network on their own (or start helpers that do) in 0.169.0.
FEATURES_OFF = ("plugins", "remote_plugin", "apps", "api_key_model_discovery",
                "skill_mcp_dependency_install", "in_app_updates", "daemon_auto_start",
                "browser_use", "computer_use", "image_generation", "multi_agent",
                "unbounded_connection_retries")


class CodexHarness(HarnessSpec):
    name = "codex"
    package = Package("npm", "@openai/codex", "0.169.0", bin="codex")
    dialect = "openai-responses"
    shell_tool = "exec_command"
    # (first request, 8,621 tokens with tiny's tokenizer, task included, + 4,096) * 4/3,
    # to a multiple of 1,024; at it the CLI neither compacts nor continues (test_harness_limits)
    min_context = 17_408
    env = {"NO_COLOR": "1"}

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return ["exec", "--json", "--color", "never", "--ephemeral", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", "-m", endpoint.model, "-"]

    def stdin(self, prompt: str) -> str | None:
        return prompt

    def config_files(self, endpoint: Endpoint) -> dict[str, str]:
        # JSON strings are valid TOML basic strings: any URL or model name is quoted safely.
        def q(value: str) -> str:
            return json.dumps(value)

        lines = [
            f"model = {q(endpoint.model)}",
            f"model_provider = {q(PROVIDER)}",
            "check_for_update_on_startup = false",
            f"model_context_window = {endpoint.context_length}",
            f"model_auto_compact_token_limit = {endpoint.context_length * 3 // 4}",
            f"[model_providers.{q(PROVIDER)}]",
            f"name = {q(PROVIDER)}",
            f"base_url = {q(endpoint.base_url.rstrip('/') + '/v1')}",
            f"env_key = {q(KEY_VARIABLE)}",
            'wire_api = "responses"',
            "[analytics]",
            "enabled = false",
            "[features]",
            *(f"{feature} = false" for feature in FEATURES_OFF),
        ]
        return {".codex/config.toml": "\n".join(lines) + "\n"}

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        return {KEY_VARIABLE: endpoint.api_key}

    def parse_output(self, stdout: str) -> HarnessOutput:
        final: str | None = None
        error: str | None = None
        n_tool_calls: int | None = None
        for event in json_events(stdout):
            kind = event.get("type")
            item = event.get("item") or {}
            if kind == "thread.started" and n_tool_calls is None:
                n_tool_calls = 0
            elif kind == "item.completed" and item.get("type") == "agent_message":
                final = item.get("text") or final
            elif kind == "item.completed" and item.get("type") == "command_execution":
                n_tool_calls = (n_tool_calls or 0) + 1
            elif kind == "turn.failed":
                error = str((event.get("error") or {}).get("message") or event)
            elif kind == "error":
                error = str(event.get("message") or event)
        return HarnessOutput(final, n_tool_calls, tail(stdout), error)
