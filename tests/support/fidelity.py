"""Helpers for running the real CLIs through the real proxy with a scripted policy: the engine,
one harness run in a local sandbox (`harness_gym.harness_check.run_harness`, which
`harness-gym harnesses --check` runs too), and the first prompt the model saw, decoded."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.engines.smollm2 import smollm2_model_dir
from harness_gym.engines.tiny import load_tiny_tokenizer
from harness_gym.harness_check import HarnessRun, run_harness, scripted_engine

__all__ = ["HarnessRun", "run_harness", "scripted", "tokenizer"]


@cache
def tokenizer(name: str) -> Any:
    """The tiny model's tokenizer, or SmolLM2's (its real BPE, with our tool template)."""
    if name == "tiny":
        return load_tiny_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_model_dir(), local_files_only=True)


def scripted(script: Callable[[str], str], tokenizer_name: str = "tiny",
             max_context: int = 131_072) -> ScriptedEngine:
    """A scripted policy in a real tokenizer, reporting `max_context` as its window (no scoring
    model: its logprobs are 0.0, which these tests do not look at)."""
    return scripted_engine(script, tokenizer(tokenizer_name), max_context)
