"""Policy engines: token ids in, token ids and per-token logprobs out, streamed.

`load_engine("tiny")`, `load_engine("smollm2")`, `load_engine("hf:/path/to/model")`: a spec
string names a loader in the `harness_gym.engines` entry-point group (`name` or `name:arg`), so
another package adds an engine with nothing but an entry point. An `Engine` object passes through.

The transformers-backed names are imported on first use: `import harness_gym.engines` stays
cheap (no torch) for code that only needs the seam, like a proxy in front of a remote engine.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..plugins import load_plugin, plugin_names
from .base import (
    Completion,
    ContextLengthExceeded,
    Engine,
    EngineError,
    FinishReason,
    RequestContext,
    SamplingParams,
    TokenChunk,
)

if TYPE_CHECKING:
    from .smollm2 import load_smollm2_engine, smollm2_model_dir
    from .tiny import load_tiny_engine, load_tiny_tokenizer, tiny_model_dir
    from .transformers_engine import TransformersEngine, load_hf_engine

ENTRY_POINT_GROUP = "harness_gym.engines"

_LAZY = {
    "TransformersEngine": ".transformers_engine",
    "load_hf_engine": ".transformers_engine",
    "load_tiny_engine": ".tiny",
    "load_tiny_tokenizer": ".tiny",
    "tiny_model_dir": ".tiny",
    "load_smollm2_engine": ".smollm2",
    "smollm2_model_dir": ".smollm2",
}

__all__ = [
    "Completion",
    "ContextLengthExceeded",
    "Engine",
    "EngineError",
    "FinishReason",
    "RequestContext",
    "SamplingParams",
    "TokenChunk",
    "TransformersEngine",
    "available_engines",
    "load_engine",
    "load_hf_engine",
    "load_smollm2_engine",
    "load_tiny_engine",
    "load_tiny_tokenizer",
    "smollm2_model_dir",
    "tiny_model_dir",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_engines() -> list[str]:
    """Engine names registered in the `harness_gym.engines` entry-point group."""
    return plugin_names(ENTRY_POINT_GROUP)


def load_engine(spec: str | Engine) -> Engine:
    """Build the engine a spec names: `"tiny"`, `"smollm2"`, `"hf:/models/x"`, `"vllm:URL"`...

    >>> engine = load_engine("tiny")
    >>> engine.model_name, engine.tokenizer_source
    ('tiny', 'tiny')
    >>> engine.close()
    """
    if isinstance(spec, Engine):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"an engine spec is a non-empty string or an Engine, got {spec!r}")
    name, _, arg = spec.strip().partition(":")
    return load_plugin(ENTRY_POINT_GROUP, name, Engine, arg, noun="engine", error=ValueError)
