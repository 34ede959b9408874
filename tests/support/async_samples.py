"""What the asynchronous GRPO tests share: the tiny model, a config, trace segments of real
tiny-engine generations with their sampling recorded, and a rollout worker whose samples are
ready (tests/test_async_grpo.py, tests/test_async_resume.py)."""

from __future__ import annotations

import asyncio
import queue
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from trl.experimental.async_grpo import AsyncGRPOConfig

from harness_gym.engines import SamplingParams
from harness_gym.engines.tiny import tiny_model_dir
from harness_gym.integrations.async_grpo import RolloutWorkerError


def tiny_model() -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)


def args(tmp_path, **overrides: Any) -> AsyncGRPOConfig:
    settings = dict(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                    learning_rate=1e-2, max_staleness=1, use_cpu=True, report_to="none",
                    save_strategy="no", bf16=False, seed=0)
    settings.update(overrides)
    return AsyncGRPOConfig(**settings)


def generated_segment(engine, text: str, version: int, max_tokens: int = 8,
                      **sampling: Any) -> dict[str, Any]:
    """A trace segment of one real generation of the tiny engine, its sampling recorded as
    the proxy records it."""
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False)
    params = SamplingParams(max_tokens=max_tokens, seed=0, **sampling)
    out = asyncio.run(engine.generate(prompt, params))
    return {"role": "agent", "prompt_ids": list(prompt), "response_ids": out.token_ids,
            "loss_mask": [1] * len(out.token_ids), "response_logprobs": out.logprobs,
            "policy_version": version, "policy_versions": [version], "call_starts": [0],
            **recorded(params)}


def recorded(*calls: SamplingParams) -> dict[str, list[Any]]:
    return {"sampling_temperature": [c.temperature for c in calls],
            "sampling_top_p": [c.top_p for c in calls], "sampling_top_k": [c.top_k for c in calls]}


def two_call_segment(engine, first: SamplingParams, second: SamplingParams) -> dict[str, Any]:
    """One segment of two calls sampled differently, a tool result inserted between them."""
    segment = generated_segment(engine, "two calls", version=1, max_tokens=first.max_tokens,
                                temperature=first.temperature, top_p=first.top_p,
                                top_k=first.top_k)
    inserted = engine.tokenizer.encode("\ntool says ok\n", add_special_tokens=False)
    prompt2 = segment["prompt_ids"] + segment["response_ids"] + inserted
    out = asyncio.run(engine.generate(prompt2, second))
    start2 = len(segment["response_ids"])
    segment["response_ids"] += inserted + out.token_ids
    segment["loss_mask"] += [0] * len(inserted) + [1] * len(out.token_ids)
    segment["response_logprobs"] += [0.0] * len(inserted) + out.logprobs
    segment.update(policy_versions=[1, 1], call_starts=[0, start2], **recorded(first, second))
    return segment


class ReadySamples:
    """A rollout worker whose samples are ready (real tiny-model generations with chosen
    versions), so the staleness rule meets exactly the lags a test names."""

    def __init__(self, samples: list[Any]) -> None:
        self.rollout_buffer: queue.Queue[Any] = queue.Queue()
        for sample in samples:
            self.rollout_buffer.put(sample)
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.versions: list[int] = []

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def update_model_version(self, model_version: int) -> None:
        self.versions.append(model_version)

    def check_health(self, stale_after_s: float) -> None:
        raise RolloutWorkerError("no more samples")
