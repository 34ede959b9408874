"""LoRA for SFT and GRPO, with engines that always get merged full weights.

Why: a full-weight checkpoint of SmolLM2-135M is 540 MB (and its optimizer state twice that), so
a run's checkpoints cannot travel in git from one machine to the next; a rank-8 adapter on the
attention's query and value projections is ~1.8 MB. The engines that serve the policy (vLLM's
`reload_weights`, a `TransformersEngine`) know nothing of adapters: they load the base model's
parameter names and shapes. So every path from a LoRA model to an engine goes through
`merged_named_parameters` (each GRPO step's weight sync; it lives in `engines.lora_merge`, so
the TRL integration reaches it without importing this floor) or `materialise` (a checkpoint's
adapter, merged into a safetensors directory on local disk, for an evaluation).

    >>> from transformers import AutoModelForCausalLM
    >>> from harness_gym.engines.tiny import tiny_model_dir
    >>> base = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    >>> names = [name for name, _ in base.named_parameters()]
    >>> model = with_lora(base, LoraSpec(rank=4))
    >>> [name for name, _ in merged_named_parameters(model)] == names
    True
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines.lora_merge import UnsupportedAdapterError, merged_named_parameters

__all__ = ["LoraSpec", "UnsupportedAdapterError", "is_adapter_dir", "load_adapter",
           "materialise", "merged_named_parameters", "with_lora"]

ADAPTER_CONFIG = "adapter_config.json"  # what `save_pretrained` of a peft model writes
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGED_FROM = "merged_from.sha256"  # a materialised directory: the adapter it merged


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter: `rank`, `alpha` (the update is scaled by alpha / rank; None: 2 x rank)
    and the linear layers it wraps (module names as in the model, e.g. Qwen2's and Llama's
    `q_proj`, `v_proj`: peft's own default for both)."""

    rank: int
    alpha: float | None = None
    targets: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"a LoRA rank is at least 1, got {self.rank}")
        if not self.targets:
            raise ValueError("LoRA wraps at least one module: give targets")

    def peft_config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(r=self.rank, lora_alpha=self.alpha or 2 * self.rank,
                          target_modules=list(self.targets), lora_dropout=0.0, bias="none",
                          task_type="CAUSAL_LM")


def with_lora(model: Any, spec: LoraSpec) -> Any:
    """`model` with a fresh, trainable adapter (peft's `get_peft_model`: B starts at zero, so the
    wrapped model computes exactly what `model` did); only the adapter requires grad."""
    from peft import get_peft_model

    return get_peft_model(model, spec.peft_config())


def load_adapter(base: Any, adapter_dir: str | Path, *, trainable: bool = True) -> Any:
    """`base` (a model) with the adapter saved in `adapter_dir`, to train on from there."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def materialise(adapter_dir: str | Path, base_dir: str | Path, out_dir: str | Path) -> Path:
    """The full weights of `adapter_dir` on the base model in `base_dir`: a model directory
    (config, `model.safetensors`, the base's tokenizer) at `out_dir`, whole or absent. One made
    earlier from the same adapter (its weights' hash, kept beside) is taken as it is."""
    import hashlib

    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    digest = hashlib.sha256((Path(adapter_dir) / ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    if (out / "model.safetensors").exists() and (out / MERGED_FROM).is_file() \
            and (out / MERGED_FROM).read_text() == digest:
        return out
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="float32")
    merged = load_adapter(base, adapter_dir, trainable=False).merge_and_unload()
    merged.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(tmp)
    (tmp / MERGED_FROM).write_text(digest)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
