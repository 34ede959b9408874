"""aider (PyPI `aider-chat`): the pair-programming CLI that edits through text edit blocks, not tool
calls, speaking OpenAI Chat Completions through litellm. Installed into its own venv in the cache.

Measured with 0.86.2 (tests/test_harness_aider.py):

- The venv is ~690 MB (litellm, tree-sitter grammars, ...) and installs in ~40 s from a warm pip
  cache.
- Pointed at us by litellm's `openai/MODEL` route: `OPENAI_API_BASE` (ends in `/v1`) and
  `OPENAI_API_KEY`; `--model openai/MODEL`.
- No tools: the model answers with edits in the chat's edit format, which aider parses and
  applies itself. We fix the format to `udiff` (`EDIT_FORMAT`): fenced ```diff blocks, one per
  file, hunk line numbers ignored (the oracle answers in it: `engines/oracle.py`). It asks before
  editing a file not added to the chat; `--yes-always` says yes. With `--message` it sends one
  request, applies the edits and exits: linting, tests, commits, shell-command suggestions and
  URL scraping are off, so nothing asks the model again (an edit that fails to apply is sent
  back, up to 3 times). An episode is one answer: the policy cannot run commands. The oracle's
  udiff blocks solved all 13 built-in tasks on bwrap, each diff equal to the gold patch's lines.
  The teacher's answer (`engines/teacher.py`: the gold hunks under `@@ ... @@` headers, no line
  numbers) solved all 13 too, on bwrap, one request each.
- Offline: `--no-check-update` (PyPI), `--analytics-disable` (PostHog), the model's metadata
  given in `~/.aider.model.metadata.json` (else it downloads litellm's price list from GitHub into
  `~/.aider/caches`), `LITELLM_LOCAL_MODEL_COST_MAP=True` (litellm's own fetch at import),
  `--no-show-model-warnings`, `--no-git` (the episode's repo is ours to diff, not aider's to
  commit), repo map off (`--map-tokens 0`). Its chat and input histories (by default files in the
  repo) go to /dev/null.
- Limits: `max_input_tokens` (the window less the cap) / `max_output_tokens` in the metadata file,
  and `max_tokens` per request through `~/.aider.model.settings.yml`'s `extra_params`: its one
  request asks for exactly that cap, or the room left (test_harness_limits). Over
  `max_input_tokens` aider warns and asks "Try to proceed anyway?", which `--yes-always` answers
  yes: it sends the request, the proxy refuses it as too long, and the episode ends
  `infra_error` ("first request is ... tokens", measured with a 1,024-token window).
- The prompt, on stdin, whole. aider reads a message starting with "/" or "!" as one of its own
  commands (`Commands.is_command`): routes-61's task text starts with "/users/<int:id>", and
  aider answered "Invalid command" without a request. And `--message-file` turns "\r\n" into
  "\n" (the conformance check said so). So we start it through its venv's python (`LAUNCHER`):
  the text read in binary, that check off; the task text is sent as written, the last user message
  whole; aider's edit-format reminder follows as a system message (`reminder: sys`; by default it
  appends it to the task's message).
- Requests (a logging server): one `POST /v1/chat/completions`, `stream: true`, `temperature: 0`,
  `max_tokens` as told; a system prompt, three canned example exchanges, the task, the reminder.
"""

from __future__ import annotations

import json

from ..harness import Endpoint, HarnessOutput, HarnessSpec, Package, tail

EDIT_FORMAT = "udiff"
# Under HOME, where aider looks for them by default (it does not expand "~" in its flags).
METADATA_FILE = ".aider.model.metadata.json"
SETTINGS_FILE = ".aider.model.settings.yml"


# aider's `main` on the task from stdin, read whole in binary (its `--message-file` reads in text
# mode, turning "\r\n" into "\n"), given as `--message=TEXT` (so a text starting with "-" is no
# flag), and never read as one of aider's commands (the text is for the model).
LAUNCHER = (
    "import sys\n"
    "from aider.commands import Commands\n"
    "Commands.is_command = lambda self, inp: False\n"
    "message = sys.stdin.buffer.read().decode('utf-8')\n"
    "from aider.main import main\n"
    "sys.exit(main([*sys.argv[1:], '--message=' + message]))\n"
)


class AiderHarness(HarnessSpec):
    name = "aider"
    package = Package("pip", "aider-chat", "0.86.2", bin="python")  # runs `LAUNCHER`
    dialect = "openai-chat"
    shell_tool = ""  # none: it edits through `EDIT_FORMAT` blocks in the answer
    edit_format = EDIT_FORMAT
    # (first request, 1,648 tokens with tiny's tokenizer, task included, + 4,096) * 4/3,
    # to a multiple of 1,024; at it its one request fits with the cap (test_harness_limits)
    min_context = 8_192
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "TERM": "dumb",
           "AIDER_CHECK_UPDATE": "false", "AIDER_ANALYTICS": "false"}

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return [
            "-c", LAUNCHER, "--model", f"openai/{endpoint.model}", "--edit-format", EDIT_FORMAT,
            "--yes-always",
            "--no-git", "--no-gitignore", "--no-auto-commits", "--no-dirty-commits",
            "--map-tokens", "0", "--no-auto-lint", "--no-auto-test",
            "--no-suggest-shell-commands", "--no-detect-urls", "--no-check-update",
            "--analytics-disable", "--no-show-model-warnings", "--no-show-release-notes",
            "--no-pretty", "--no-fancy-input", "--no-restore-chat-history", "--encoding", "utf-8",
            "--chat-history-file", "/dev/null", "--input-history-file", "/dev/null",
        ]

    def stdin(self, prompt: str) -> str | None:
        return prompt

    def config_files(self, endpoint: Endpoint) -> dict[str, str]:
        model = f"openai/{endpoint.model}"
        metadata = {model: {
            "max_input_tokens": endpoint.context_length - endpoint.max_tokens,
            "max_tokens": endpoint.max_tokens, "max_output_tokens": endpoint.max_tokens,
            "input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
            "litellm_provider": "openai", "mode": "chat",
        }}
        # YAML is a superset of JSON: any model name is quoted safely.
        # `reminder: sys`: its edit-format reminder as a system message after the task, not
        # appended to the task's user message (which then holds the task text and nothing else).
        settings = [{"name": model, "edit_format": EDIT_FORMAT, "use_repo_map": False,
                     "reminder": "sys", "extra_params": {"max_tokens": endpoint.max_tokens}}]
        return {METADATA_FILE: json.dumps(metadata), SETTINGS_FILE: json.dumps(settings)}

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        base = endpoint.base_url.rstrip("/") + "/v1"
        return {"OPENAI_API_BASE": base, "OPENAI_API_KEY": endpoint.api_key}

    def parse_output(self, stdout: str) -> HarnessOutput:
        # It prints the model's answer and its own notices as plain text; no tool calls.
        return HarnessOutput(None, 0, tail(stdout))
