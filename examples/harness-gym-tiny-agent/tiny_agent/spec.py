"""The harness-gym plugin spec for tiny-agent: per-harness knowledge as data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness_gym.harness import Endpoint, HarnessOutput, HarnessSpec, Package, tail


class TinyAgentHarness(HarnessSpec):
    name = "tiny-agent"
    package = Package("pip", "harness-gym-tiny-agent", "0.1.0", bin="tiny-agent")
    dialect = "openai-chat"
    shell_tool = "bash"

    # The agent ships inside this Python package: nothing to download.
    def install(self, cache_dir=None, progress=None) -> Path:
        return Path(__file__).parent

    def is_installed(self, cache_dir=None) -> bool:
        return True

    def executable(self, cache_dir=None) -> Path:
        return Path(sys.executable)

    def args(self, endpoint: Endpoint, prompt: str) -> list[str]:
        return ["-m", "tiny_agent.cli", prompt]

    def endpoint_env(self, endpoint: Endpoint) -> dict[str, str]:
        return {"TINY_AGENT_BASE_URL": endpoint.base_url.rstrip("/") + "/v1",
                "TINY_AGENT_API_KEY": endpoint.api_key, "TINY_AGENT_MODEL": endpoint.model,
                "PYTHONPATH": str(Path(__file__).parent.parent)}

    def parse_output(self, stdout: str) -> HarnessOutput:
        for line in reversed(stdout.splitlines()):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("type") == "final":
                return HarnessOutput(event.get("text"), event.get("tool_calls"), tail(stdout))
        return HarnessOutput(None, None, tail(stdout), error="tiny-agent printed no final event")
