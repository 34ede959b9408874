"""mini-swe-agent (PyPI `mini-swe-agent`): Princeton/Stanford's minimal agent, one `bash` tool,
speaking OpenAI Chat Completions through litellm. Installed into its own venv in the cache.

Measured with 2.4.6 (tests/test_harness_more_clis.py):

- The venv is ~754 MB (litellm and its dependencies) and installs in ~2.5 min.
- Pointed at us by litellm's `openai/MODEL` route: `OPENAI_API_BASE` / `OPENAI_BASE_URL` (ends
  in `/v1`) and `OPENAI_API_KEY`; the model, step limit and output cap go in as `-c key=value`
  overrides layered on its `mini.yaml`.
- Offline: `LITELLM_LOCAL_MODEL_COST_MAP=True` keeps litellm from fetching its model price
  list from GitHub at import; cost tracking is off (`model.cost_tracking=ignore_errors`,
  `--cost-limit 0`: it knows no price for our model). `MSWEA_SILENT_STARTUP` drops the banner.
- It ends an episode only when the model runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`; an
  answer without a tool call is a format error it asks about again, so `agent.step_limit` is
  the backstop (the oracle submits that way: `engines/oracle.py`).
- Limits: `model.model_kwargs.max_tokens` is each request's cap; it keeps the whole history and
  never compacts, so a window it outgrows ends the episode with the proxy's context error.
- The prompt: `mini.yaml` wraps the task in its instance template ("Please solve this issue:
  {{task}}" and ~90 lines of workflow rules, the submit command among them), so the model would
  never see the task text alone. `LAUNCHER` (run by the venv's python) moves those rules, as
  written, to the end of the system template and makes the instance template `{{task}}`: the
  first user message is the task text, byte for byte (Jinja inserts a value as is; `{{ }}` and
  `{% %}` in the task are not evaluated). It reads the task from stdin, whole, and hands it to
  mini's `main` in-process (`--task=TEXT`; its only other way in is an argument, capped at
  128 KiB by the kernel). A `mini.yaml` whose instance template no longer starts with
  `TASK_LINE` stops the launcher with a message naming this file.
"""

from __future__ import annotations

from ..harness import Endpoint, HarnessOutput, HarnessSpec, Package, tail

STEP_LIMIT = 50
# The first line of 2.4.6 mini.yaml's instance template.
TASK_LINE = "Please solve this issue: {{task}}"

# mini's `main`, with mini.yaml's instance instructions moved into the system template, and the
# task read from stdin in binary (no newline translation) as the whole first user message.
LAUNCHER = f"""\
import sys
from minisweagent.config import get_config_from_spec
agent = get_config_from_spec("mini.yaml")["agent"]
before, line, rules = agent["instance_template"].partition({TASK_LINE!r})
if before or not line:
    sys.exit("harness-gym: mini.yaml's instance template no longer starts with TASK_LINE "
             "(harnesses/mini_swe_agent.py)")
system = agent["system_template"].rstrip("\\n") + "\\n\\n" + rules.lstrip("\\n")
task = sys.stdin.buffer.read().decode("utf-8")
sys.argv = ["mini", *sys.argv[1:], "-c", "agent.system_template=" + system,
            "-c", "agent.instance_template={{{{task}}}}", "--task=" + task]
from minisweagent.run.mini import app
app()
"""


class MiniSweAgentHarness(HarnessSpec):
    name = "mini-swe-agent"
    package = Package("pip", "mini-swe-agent", "2.4.6", bin="python")  # runs `LAUNCHER`
    dialect = "openai-chat"
    shell_tool = "bash"
    # (first request, 1,324 tokens with tiny's tokenizer, task included, + 4,096) * 4/3,
    # to a multiple of 1,024; at it the CLI neither compacts nor continues (test_harness_limits)
    min_context = 8_192
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_SILENT_STARTUP": "1",
           "MSWEA_CONFIGURED": "true", "NO_COLOR": "1"}

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        overrides = {
            "model.model_name": f"openai/{endpoint.model}",
            "model.cost_tracking": "ignore_errors",
            "model.model_kwargs.max_tokens": str(endpoint.max_tokens),
            "agent.step_limit": str(STEP_LIMIT),
        }
        return ["-c", LAUNCHER, "-y", "--exit-immediately", "--cost-limit", "0", "-c", "mini.yaml",
                *(arg for key, value in overrides.items() for arg in ("-c", f"{key}={value}"))]

    def stdin(self, prompt: str) -> str | None:
        return prompt

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        base = endpoint.base_url.rstrip("/") + "/v1"
        return {"OPENAI_API_BASE": base, "OPENAI_BASE_URL": base,
                "OPENAI_API_KEY": endpoint.api_key}

    def parse_output(self, stdout: str) -> HarnessOutput:
        # It prints a rich-text transcript; the trajectory file holds the rest.
        return HarnessOutput(None, None, tail(stdout))
