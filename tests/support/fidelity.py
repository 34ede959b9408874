"""Helpers for running the real CLIs through the real proxy with a scripted policy: the engine,
one harness run in a local sandbox, and the first prompt the model saw, decoded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from harness_gym.engines.scripted import ScriptedEngine
from harness_gym.engines.smollm2 import smollm2_model_dir
from harness_gym.engines.tiny import load_tiny_tokenizer
from harness_gym.harness import Endpoint, HarnessSpec
from harness_gym.proxy import InterceptionProxy
from harness_gym.sandbox import SandboxSpec
from harness_gym.sandbox.base import ExecResult
from harness_gym.sandbox.local import LocalSandboxBackend
from harness_gym.trace import SessionTrace


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
    tok = tokenizer(tokenizer_name)
    stops = [tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id]
    return ScriptedEngine(None, script, tokenizer=tok, max_context=max_context,
                          stop_token_ids=[s for s in dict.fromkeys(stops) if s is not None],
                          model_name="policy")


@dataclass
class HarnessRun:
    result: ExecResult
    trace: SessionTrace
    endpoint: Endpoint

    def prompts(self, engine: ScriptedEngine) -> list[str]:
        """Each segment's first prompt as the model saw it (decoded token ids)."""
        return [engine.tokenizer.decode(s.prompt_ids, skip_special_tokens=False)
                for s in self.trace.segments]


def run_harness(
    harness: HarnessSpec,
    engine: ScriptedEngine,
    prompt: str,
    *,
    sampling: dict[str, Any] | None = None,
    timeout_s: float = 300,
    train_subagents: bool = False,
) -> HarnessRun:
    """One headless run of `harness` on `prompt`, through a proxy in front of `engine`, with the
    endpoint an episode would give it (the engine's window, the session's output cap)."""
    with InterceptionProxy(engine) as proxy, LocalSandboxBackend().create(SandboxSpec()) as box:
        session = proxy.open_session(sampling=sampling, train_subagents=train_subagents)
        cap = (sampling or {}).get("max_tokens") or proxy.app.settings.default_max_tokens
        endpoint = Endpoint.for_model(box.proxy_url(proxy.url), session.session_id,
                                      engine.model_name, engine.max_context, cap)
        result = harness.launch(box, endpoint, prompt).wait(timeout=timeout_s)
        proxy.close_session(session.session_id)
        return HarnessRun(result, session.trace.snapshot(), endpoint)
