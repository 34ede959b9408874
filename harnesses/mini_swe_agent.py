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
- The prompt is one argument (`--task=PROMPT`; no stdin mode), so the kernel's 128 KiB
  argument limit applies.
"""

from __future__ import annotations

from ..harness import Endpoint, HarnessError, HarnessOutput, HarnessSpec, Package, tail

MAX_ARGUMENT_BYTES = 131_072 - len("--task=") - 1
STEP_LIMIT = 50


class MiniSweAgentHarness(HarnessSpec):
    name = "mini-swe-agent"
    package = Package("pip", "mini-swe-agent", "2.4.6", bin="mini")
    dialect = "openai-chat"
    shell_tool = "bash"
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_SILENT_STARTUP": "1",
           "MSWEA_CONFIGURED": "true", "NO_COLOR": "1"}

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        if len(prompt.encode()) > MAX_ARGUMENT_BYTES:
            raise HarnessError(
                f"the task text is {len(prompt.encode())} bytes: mini-swe-agent takes its task "
                f"only as an argument, which the kernel caps at {MAX_ARGUMENT_BYTES} bytes")
        overrides = {
            "model.model_name": f"openai/{endpoint.model}",
            "model.cost_tracking": "ignore_errors",
            "model.model_kwargs.max_tokens": str(endpoint.max_tokens),
            "agent.step_limit": str(STEP_LIMIT),
        }
        return ["-y", "--exit-immediately", "--cost-limit", "0", "-c", "mini.yaml",
                *(arg for key, value in overrides.items() for arg in ("-c", f"{key}={value}")),
                f"--task={prompt}"]

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        base = endpoint.base_url.rstrip("/") + "/v1"
        return {"OPENAI_API_BASE": base, "OPENAI_BASE_URL": base,
                "OPENAI_API_KEY": endpoint.api_key}

    def parse_output(self, stdout: str) -> HarnessOutput:
        # It prints a rich-text transcript; the trajectory file holds the rest.
        return HarnessOutput(None, None, tail(stdout))
