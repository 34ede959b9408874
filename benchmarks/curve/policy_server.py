"""The run's one vLLM CPU server and the weights it holds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .process import log

if TYPE_CHECKING:
    from learning_curve import Pipeline


class PolicyServer:
    """The run's one vLLM CPU server (started at its first use, stopped by `close()`) and the
    weights it holds: a checkpoint's evaluation loads them first (`serving`), a GRPO run pushes
    its trainer's before each step's rollouts (`for_training`, `make_rollout_func`'s
    `weight_sync`)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.engine: Any = None
        self.sync: Any = None
        self.holds: str | None = None  # the weights' directory, None after a GRPO run
        self.startup_s: float | None = None
        self.load_s: list[float] = []  # each checkpoint's weight load
        self._cpu = 0.0  # the server's CPU seconds at the latest look

    def start(self) -> Any:
        if self.engine is None:
            from harness_gym.engines.vllm_server import load_vllm_serve_engine
            from harness_gym.integrations.weight_transfer import VLLMWeightTransfer

            c, base = self.pipeline.config, self.pipeline.base_dir()
            log(f"vLLM server for {base}: starting")
            wall = time.monotonic()
            self.engine = load_vllm_serve_engine(
                f"{base}?max_model_len={c.vllm_max_model_len}&kv_cache_gib={c.vllm_kv_cache_gib}")
            self.startup_s = time.monotonic() - wall
            self.sync = VLLMWeightTransfer.tmpfs(self.engine)
            self.holds = str(base)
            log(f"vLLM server up in {self.startup_s:.0f} s at {self.engine.urls[0]}")
        return self.engine

    def serving(self, name: str, weights: Path) -> Any:
        """The engine, holding the weights of checkpoint directory `weights`."""
        from safetensors.torch import load_file

        engine = self.start()
        if self.holds != str(weights):
            wall = time.monotonic()
            self.sync.push(load_file(weights / "model.safetensors").items())
            self.holds = str(weights)
            self.load_s.append(time.monotonic() - wall)
            log(f"vLLM server: {name} weights ({weights}) loaded in {self.load_s[-1]:.1f} s")
        return engine

    def for_training(self) -> dict[str, Any]:
        """`make_rollout_func`'s engine and weight sync."""
        return {"engine": self.start(), "weight_sync": self.sync}

    def forget(self) -> None:
        self.holds = None

    def stats(self) -> dict[str, Any]:
        server = getattr(self.engine, "owned_server", None)
        if server is not None:
            self.group = server.group
        return {"startup_s": self.startup_s, "process_group": getattr(self, "group", None),
                "weight_loads": len(self.load_s),
                "weight_load_s_mean": sum(self.load_s) / len(self.load_s) if self.load_s else None}

    def cpu_seconds(self) -> float:
        """CPU time of the server's processes so far (0 before it starts). A stopped server's
        count is kept: later stages start from it, so their difference stays theirs."""
        server = getattr(self.engine, "owned_server", None)
        if server is not None:
            self._cpu = server.cpu_seconds()
        return self._cpu

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            log("vLLM server: stopping")
            try:
                self.sync.destroy()
            finally:
                engine.close()  # stops the server it owns, every process of its group
