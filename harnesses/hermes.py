"""Hermes Agent (PyPI `hermes-agent`): Nous Research's agent with 16 tools (terminal,
read_file, write_file, patch, search_files, execute_code, ...), speaking OpenAI Chat
Completions to a custom provider. Installed into its own venv in the cache.

Measured with 0.19.0 (tests/test_harness_hermes.py; shapes in tests/fixtures/hermes_requests.json):

- The venv is ~230 MB and installs in ~35-50 s.
- Pointed at us by `~/.hermes/config.yaml`: `model.provider: custom`, `model.base_url` (ends in
  `/v1`), `model.api_key` (sent as `Authorization: Bearer`), `model.default` (our model) and
  `model.context_length` (without it, it probes the server for one).
- Requests: before each turn it probes the base URL for a server type and a context length:
  `GET /api/v1/models`, `/api/tags`, `/v1/props`, `/props`, `/version` (httpx; the first round
  without the Authorization header), and, before a later turn, `GET /v1/models`, `/models`
  (requests). A 404 on each is fine. Then `POST /v1/chat/completions` (OpenAI Python SDK 2.24):
  `stream: true`, `stream_options.include_usage`, `max_tokens` equal to the context length;
  ~47 KB (16 tools); system prompt as a `system` message; user content a plain string; a
  tool-call turn echoed with `content: ""` and compact re-serialized arguments; tool results
  `role: "tool"` with a `name` and, as content, a JSON string
  (`{"output": "", "exit_code": 0, "error": null}`).
- Offline: `HERMES_DISABLE_LAZY_INSTALLS=1` (else it pip-installs optional tool dependencies at
  start). Under strace it connects to nothing but the base URL.
- Tools: left to its defaults, Hermes adds toolsets whose dependencies it finds on the host
  (with `chromium` on PATH, 13 `browser_*` tools), so the same task would get another prompt on
  another machine. `platform_toolsets.cli` pins the 16 tools measured without them (an explicit
  list of its configurable toolset keys is authoritative in `hermes_cli/tools_config.py`).
- `-z PROMPT` prints only the final answer on stdout; it reports no tool-call count. A failed
  model call (after 3 tries, ~10 s) also exits 0, its error printed in the answer's place:
  `API call failed after 3 retries: HTTP 404: ...`; `parse_output` returns that as `error`.
  Other failures exit 1 or 2 with the reason on stderr only (`hermes -z: agent failed: ...`,
  `hermes -z: no final response was produced ...`); `stderr_error` returns it.
- The prompt is one argument, `--oneshot=PROMPT`: argparse takes everything after the `=`,
  a leading "-" included (`-z -x` is "expected one argument"). Hermes strips every message's
  content before sending it (`agent/conversation_loop.py`, for prefix-cache hits), so leading
  and trailing whitespace never reach the model whatever we do; it has no stdin mode, so a
  prompt over the kernel's 128 KiB argument limit cannot be passed.
- Limits: `model.context_length` and `model.max_tokens` (each request's `max_tokens`; without
  it Hermes asked for the whole context length). It refuses to start below 64,000 tokens of
  context (`MINIMUM_CONTEXT_LENGTH`, `agent/agent_init.py`); its first request is 11,602 tokens
  with SmolLM2's tokenizer (14,317 with tiny's).
"""

from __future__ import annotations

import json

from ..harness import Endpoint, HarnessError, HarnessOutput, HarnessSpec, Package, tail

_FAILED_CALL = "API call failed"
_STDERR_PREFIX = "hermes -z:"
MAX_ARGUMENT_BYTES = 131_072 - len("--oneshot=") - 1  # the kernel's MAX_ARG_STRLEN, with its NUL


# The toolsets `hermes -z` enables by default on a host without optional tools (0.19.0).
TOOLSETS = ("clarify", "code_execution", "delegation", "file", "memory", "session_search",
            "skills", "terminal", "todo", "vision")


class HermesHarness(HarnessSpec):
    name = "hermes"
    package = Package("pip", "hermes-agent", "0.19.0", bin="hermes")
    dialect = "openai-chat"
    shell_tool = "terminal"
    env = {"HERMES_DISABLE_LAZY_INSTALLS": "1"}
    min_context = 64_000  # Hermes' own MINIMUM_CONTEXT_LENGTH: below it, it refuses to start

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        if len(prompt.encode()) > MAX_ARGUMENT_BYTES:
            raise HarnessError(
                f"the task text is {len(prompt.encode())} bytes: Hermes takes its prompt only as "
                f"an argument, which the kernel caps at {MAX_ARGUMENT_BYTES} bytes"
            )
        return [f"--oneshot={prompt}"]

    def config_files(self, endpoint: Endpoint) -> dict[str, str]:
        # JSON scalars are valid YAML: no YAML library needed, and any key or URL is quoted.
        model = {
            "provider": "custom",
            "base_url": endpoint.base_url.rstrip("/") + "/v1",
            "api_key": endpoint.api_key,
            "default": endpoint.model,
            "context_length": endpoint.context_length,
            "max_tokens": endpoint.max_tokens,
        }
        lines = ["model:", *(f"  {key}: {json.dumps(value)}" for key, value in model.items()),
                 "platform_toolsets:", f"  cli: {json.dumps(list(TOOLSETS))}"]
        return {".hermes/config.yaml": "\n".join(lines) + "\n"}

    def stderr_error(self, stderr: str) -> str | None:
        said = [line for line in stderr.splitlines() if line.startswith(_STDERR_PREFIX)]
        return said[-1] if said else None

    def parse_output(self, stdout: str) -> HarnessOutput:
        final = stdout.strip() or None
        if final is not None and final.startswith(_FAILED_CALL):
            return HarnessOutput(None, None, tail(stdout), error=final)
        return HarnessOutput(final, None, tail(stdout))
