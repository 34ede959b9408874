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
  request's `max_tokens`; without it, 32,000). It compacts once a prompt passes the window less
  33,000 (`computeThresholds`: a 20,000-token summary reserve and a 13,000 buffer, whatever
  the window; its percentage setting can only lower that) and gives up on a prompt over the
  window less 23,000 ("Context is too large to send safely after automatic compression"), so
  its `min_context` holds that reserve.
- The prompt (`llm.tsx` `main`, `nonInteractiveCli.ts` `runNonInteractive`): piped stdin
  and the `--prompt` text are joined as `stdin + "\n\n" + prompt` (stdin alone gains a trailing
  "\n\n"); then a text starting with "/" (first word without a path separator) runs as a slash
  command, and one holding an "@" goes through its @-mention expansion (`atCommandProcessor.ts`),
  which puts a space before an "@path" that follows no space, drops whitespace-only runs between
  mentions, trims the text and attaches any file a mention names. No setting or flag turns
  either off (its `/model ID PROMPT` "verbatim" form trims and strips `--global`). So the task
  goes on stdin up to its last "\n\n" and the rest as `--prompt=REST` (`_split`), and
  `VERBATIM_HOOK`, loaded by node's `--import` through `NODE_OPTIONS`, changes one line of
  `runNonInteractive` as it loads: the joined input is the turn's text, as its SDK path's
  `userMessage` already is, with no slash or @ handling. A release where that line changed fails
  at start, naming this file. The changed line also unsets `NODE_OPTIONS`, so the agent's
  commands never see the hook (the CLI relaunches itself once with `--expose-gc`, and the
  relaunched process needs it until then).
- `-o stream-json` prints Claude Code's event stream (`system` init, `assistant` messages with
  `tool_use` blocks, a final `result`), so Claude Code's parser reads it.
"""

from __future__ import annotations

import base64
import json

from ..harness import Endpoint, HarnessError, HarnessOutput, HarnessSpec, Package, json_events
from .claude_code import ClaudeCodeHarness

MAX_ARGUMENT_BYTES = 131_072 - len("--prompt=") - 1  # the kernel's MAX_ARG_STRLEN, with its NUL
_JOIN = "\n\n"  # what Qwen Code puts between stdin and the --prompt text

# The one line of 0.24.4's `runNonInteractive` (`nonInteractiveCli.ts`) the hook changes: with a
# turn's parts already given, it skips slash commands and @-mentions; we give the input as them.
RUN_MARKER = "// packages/cli/src/nonInteractiveCli.ts"
RUN_LINE = ("let initialPartList = extractPartsFromUserMessage(\n"
            "        options.userMessage\n      );")
# It also drops the hook from the environment there, in the process that runs the agent (the CLI
# relaunches itself once, and the relaunched process needs it), so the agent's commands never
# see it.
RUN_LINE_VERBATIM = ("delete process.env.NODE_OPTIONS; "
                     "let initialPartList = extractPartsFromUserMessage(options.userMessage) ?? "
                     "(options.continueInterrupted ? null : [{ text: input }]);")
_HOOKS = f"""
const marker = {json.dumps(RUN_MARKER)}, line = {json.dumps(RUN_LINE)};
export async function load(url, context, nextLoad) {{
  const loaded = await nextLoad(url, context);
  if (loaded.format !== "module" || !url.includes("/@qwen-code/qwen-code/")) return loaded;
  const raw = loaded.source;
  const source = typeof raw === "string" ? raw : new TextDecoder().decode(raw);
  if (!source.includes(marker)) return loaded;
  if (!source.includes(line)) throw new Error(
    "harness-gym: this Qwen Code's runNonInteractive no longer has the line " +
    "harnesses/qwen_code.py rewrites to keep the task text verbatim; update RUN_LINE there");
  return {{ ...loaded, source: source.replace(line, {json.dumps(RUN_LINE_VERBATIM)}) }};
}}
"""


def _data_url(source: str) -> str:
    return "data:text/javascript;base64," + base64.b64encode(source.encode()).decode()


# Registered before the CLI's first module loads (`--import` in NODE_OPTIONS).
VERBATIM_HOOK = _data_url(
    f'import {{ register }} from "node:module"; register({json.dumps(_data_url(_HOOKS))});')


def _split(prompt: str) -> tuple[str | None, str]:
    """(stdin, --prompt text) that Qwen Code joins back into `prompt`: stdin up to the last
    "\n\n" with text on both sides (an empty stdin is no stdin to it), else all of it as the
    argument."""
    at = prompt.rfind(_JOIN, 1, len(prompt) - 1)
    if at < 0:
        return None, prompt
    return prompt[:at], prompt[at + len(_JOIN):]


class QwenCodeHarness(HarnessSpec):
    name = "qwen-code"
    package = Package("npm", "@qwen-code/qwen-code", "0.24.4", bin="qwen")
    dialect = "openai-chat"
    shell_tool = "run_shell_command"
    # (first request, 22,958 tokens with tiny's tokenizer, task included, + 4,096 + its 33,000
    # compaction reserve) * 4/3, to a multiple of 1,024; at it the CLI neither compacts nor
    # continues (test_harness_limits); at 36,864 it refused its second request itself
    min_context = 80_896
    env = {"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1", "NO_COLOR": "1",
           "NODE_OPTIONS": f"--import={VERBATIM_HOOK}"}

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        rest = _split(prompt)[1]
        if len(rest.encode()) > MAX_ARGUMENT_BYTES:
            raise HarnessError(
                f"the task text's last paragraph is {len(rest.encode())} bytes: Qwen Code takes "
                f"it as an argument, which the kernel caps at {MAX_ARGUMENT_BYTES} bytes")
        return ["-m", endpoint.model, "--approval-mode", "yolo", "-o", "stream-json",
                f"--prompt={rest}"]

    def stdin(self, prompt: str) -> str | None:
        return _split(prompt)[0]

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
